"""One stream, in process: mlx-lm's generate_step vs our scheduler + batch runner at B=1.

    python -m bench.lone_stream --model DIR [--tokens 256] [--runs 3]

Isolates the engine's single-stream decode speed from HTTP and process boundaries.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

from engine.batch.runner import BatchRunner
from engine.batch.scheduler import Scheduler, SchedulerConfig
from engine.types import Request, SamplingParams


def direct(model: Any, prompt: list[int], n: int) -> float:
    steps = generate_step(mx.array(prompt), model, max_tokens=n)
    next(steps)
    start = time.perf_counter()
    count = sum(1 for _ in steps)
    return count / (time.perf_counter() - start)


def engine(model: Any, prompt: list[int], n: int, lone_row: bool = True) -> float:
    sched = Scheduler(SchedulerConfig(), frozenset())
    runner = BatchRunner(model, lone_row=lone_row)
    sched.add(Request("r", tuple(prompt), SamplingParams(), n + 1))
    start, count = 0.0, 0
    while sched.has_work:
        plan = sched.schedule()
        for sid in plan.admitted:
            runner.admit(sched.get(sid).request)  # type: ignore[union-attr]
        for _ in sched.update(plan, runner.step(plan)):
            count += 1
            if count == 1:
                start = time.perf_counter()
    return (count - 1) / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    model, tokenizer = load(args.model)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Tell me a long story."}], add_generation_prompt=True
    )
    for name, fn in (("warmup-direct", direct), ("warmup-engine", engine)):
        fn(model, prompt, 32)
    results: dict[str, list[float]] = {"direct": [], "engine": []}
    for _ in range(args.runs):
        results["direct"].append(direct(model, prompt, args.tokens))
        results["engine"].append(engine(model, prompt, args.tokens))
    d, e = (statistics.median(results[k]) for k in ("direct", "engine"))
    print(f"device {mx.default_device()}  direct {d:.1f} tok/s  engine {e:.1f} tok/s  ratio {e / d:.3f}")
    print({k: [round(v, 1) for v in vs] for k, vs in results.items()})


if __name__ == "__main__":
    main()
