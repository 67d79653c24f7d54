"""Where one stream's per-token time goes on the host, direct against our core (issue 19 item 1).

    python -m bench.host_split --model DIR [--tokens 256] [--rounds 10]

One greedy request, `stream_generate` and our whole core (`bench.stream_contexts.bare_core`) in
this process, interleaved by round. Each token's wall time (first token to last) is split by
wrapping what both call alike: the model's forward (building the step's graph in Python),
`mx.async_eval` (MLX queuing it: on an accelerator, encoding and launching its kernels) and
`mx.eval` (waiting for a step), plus the main thread's CPU time per token. What is left is every
other line of Python on the thread: for `stream_generate` the generator and the detokenizer,
for ours the runner, scheduler, detokenizer, stop matching and events. The wrappers cost the
same on both sides. Only the decode is counted: from each side's first token to its last (the
prompt's prefill, which one side evaluates with `mx.eval` and the other with `mx.async_eval`, is
left out), so the parts add up to the decode rate's time a token. `--only 'our core'` (or
`stream_generate`) runs one side alone, to profile it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from bench.single_stream import MESSAGES
from bench.speculation import load_as_served
from bench.stream_contexts import bare_core, core_stamps, direct_stamps

PARTS = ("forward", "async_eval", "eval")


class Split:
    """Every wrapped call's (start, end, part), to be summed over a window afterwards."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float, str]] = []

    def wrap(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        calls = self.calls

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                calls.append((t, time.perf_counter(), part))

        return timed

    def spent(self, start: float, end: float) -> dict[str, float]:
        """Seconds in each part within [start, end] (a call across an edge counts its inside)."""
        out = dict.fromkeys(PARTS, 0.0)
        for t0, t1, part in self.calls:
            if t1 > start and t0 < end:
                out[part] += min(t1, end) - max(t0, start)
        return out


def stamp() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument(
        "--only", choices=("stream_generate", "our core"), help="run one side alone (for a profiler)"
    )
    args = p.parse_args()
    model, tokenizer = load_as_served(args.model)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    split = Split()
    cls = type(model)
    forward = cls.__call__
    cls.__call__ = split.wrap("forward", forward)  # type: ignore[method-assign]
    mx.async_eval = split.wrap("async_eval", mx.async_eval)
    mx.eval = split.wrap("eval", mx.eval)
    runs: dict[str, Callable[[], list[tuple[float, float]]]] = {
        "stream_generate": lambda: direct_stamps(model, tokenizer, prompt, args.tokens, stamp),
        "our core": lambda: core_stamps(bare_core(model, tokenizer), prompt, args.tokens, stamp),
    }
    if args.only:
        runs = {args.only: runs[args.only]}
    us: dict[str, dict[str, list[float]]] = {
        k: {x: [] for x in ("wall", "cpu", *PARTS, "rest")} for k in runs
    }
    for r in range(args.rounds + 2):  # two warm-up rounds
        for name, run in runs.items():
            split.calls.clear()
            stamps = run()
            if r < 2:
                continue
            (w0, c0), (w1, c1) = stamps[0], stamps[-1]
            per = 1e6 / (len(stamps) - 1)  # the decode: first token to last
            spent = split.spent(w0, w1)
            row = us[name]
            row["wall"].append(per * (w1 - w0))
            row["cpu"].append(per * (c1 - c0))
            for part in PARTS:
                row[part].append(per * spent[part])
            row["rest"].append(row["wall"][-1] - sum(row[part][-1] for part in PARTS))
    print(
        f"model {args.model}  {args.tokens} tokens  {args.rounds} rounds, interleaved; device {mx.default_device()}"
    )
    print("  (us a token, medians; first token to last)")
    print(f"  {'':16s} " + " ".join(f"{k:>10s}" for k in next(iter(us.values()))))
    for name, row in us.items():
        print(f"  {name:16s} " + " ".join(f"{statistics.median(v):10.1f}" for v in row.values()))
    if args.only:
        return
    diff = {k: [a - b for a, b in zip(us["our core"][k], us["stream_generate"][k])] for k in us["our core"]}
    print(f"  {'ours - direct':16s} " + " ".join(f"{statistics.median(v):10.1f}" for v in diff.values()))
    ratios = [d / c for d, c in zip(us["stream_generate"]["wall"], us["our core"]["wall"])]
    print(
        f"  our core's decode rate / stream_generate's: {statistics.median(ratios):.3f}x "
        f"[{min(ratios):.3f}-{max(ratios):.3f}]"
    )


if __name__ == "__main__":
    main()
