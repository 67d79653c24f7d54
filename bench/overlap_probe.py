"""Whether per-token Python costs one stream its speed, and whether a second thread hides it.

    python -m bench.overlap_probe --model DIR [--tokens 256] [--rounds 10] [--work-us 30,60]

mlx-lm's `stream_generate` on one greedy request, interleaved by round with the same loop plus
W µs of pure-Python work per token (a fixed amount of work, its cost calibrated on this host
before the runs), done either on the generating thread itself ("inline") or handed to a second
thread through a queue ("thread"). MLX releases the GIL while it queues a step's kernels
(`mx.async_eval`), so work on a second thread can run then. If the decode is bound by the host
thread, inline work slows it by about W per token; the thread rows say how much of that a
second thread takes off. Rates are decode tokens per second, first token to last.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time
from collections.abc import Callable

from mlx_lm.generate import stream_generate

from bench.single_stream import MESSAGES, rate
from bench.speculation import load_as_served


def work(n: int) -> int:
    """n units of dict-and-list Python, the kind our per-token bookkeeping is."""
    d: dict[int, int] = {}
    acc = 0
    for i in range(n):
        d[i & 15] = i
        acc += d.get(i & 7, 0) & 3
    return acc


def calibrate(us: float) -> int:
    """The units of `work` that take `us` microseconds on this host (median of several)."""
    n = 1000
    samples = []
    for _ in range(50):
        t = time.perf_counter()
        work(n)
        samples.append(time.perf_counter() - t)
    per_unit = statistics.median(samples) / n
    return max(1, round(us * 1e-6 / per_unit))


class Worker:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (n := self.jobs.get()) is not None:
            work(n)

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--work-us", default="30,60")
    args = p.parse_args()
    model, tokenizer = load_as_served(args.model)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    worker = Worker()

    def run(per_token: Callable[[], object] | None) -> float:
        times = []
        for _ in stream_generate(model, tokenizer, prompt, max_tokens=args.tokens):
            times.append(time.perf_counter())
            if per_token is not None:
                per_token()
        return rate(times)

    kinds: dict[str, Callable[[], float]] = {"direct": lambda: run(None)}
    for us in (float(x) for x in args.work_us.split(",")):
        n = calibrate(us)
        kinds[f"inline {us:g} us"] = lambda n=n: run(lambda: work(n))  # type: ignore[misc]
        kinds[f"thread {us:g} us"] = lambda n=n: run(lambda: worker.jobs.put(n))  # type: ignore[misc]
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds + 2):  # two warm-up rounds
        for name, fn in kinds.items():
            got = fn()
            if r >= 2:
                rates[name].append(got)
    worker.close()
    print(f"model {args.model}  {args.tokens} tokens  {args.rounds} rounds, interleaved")
    base = rates["direct"]
    for name, rs in rates.items():
        us_tok = statistics.median([1e6 / x - 1e6 / b for x, b in zip(rs, base)])
        ratios = [x / b for x, b in zip(rs, base)]
        print(
            f"  {name:14s} {statistics.median(rs):8.1f} tok/s  {statistics.median(ratios):.3f}x "
            f"[{min(ratios):.3f}-{max(ratios):.3f}]  {us_tok:+7.1f} us/token"
        )


if __name__ == "__main__":
    main()
