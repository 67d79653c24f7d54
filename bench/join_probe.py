"""Where a join step's time goes, in process (a diagnostic for issue 19 item 2).

    python -m bench.join_probe --model DIR [--clients 64] [--tokens 128]

First the accelerator's own time for the prefill of B joining rows at one width (evaluated
alone, the accelerator otherwise idle). Then step_profile's closed loop at C clients with the
runner's phases timed: per join step and per plain step, the mean wall time of each phase.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

import engine.batch.runner as runner_module
from bench.prompts import PromptBook, load_tokenizer
from bench.speculation import load_as_served
from bench.step_profile import run_level
from engine.host.assemble import builds_per_shape
from engine.model.mlx_boundary import (
    PromptProcessingBatch,
    generation_stream,
    greedy_sampler,
    make_prompt_cache,
)
from engine.rows.prefill import prompt_lazily


def prefill_alone(model: Any, rows: int, width: int) -> tuple[float, float]:
    """Median ms of the prefill of `rows` prompts at `width`, and of their first-token forward."""
    took, first = [], []
    for _ in range(7):
        batch = PromptProcessingBatch(
            model,
            list(range(rows)),
            [make_prompt_cache(model) for _ in range(rows)],
            fallback_sampler=greedy_sampler,
        )
        tokens = [[1 + (i * 7 + j) % 900 for j in range(width - 1 - i % 3)] for i in range(rows)]
        with mx.stream(generation_stream):
            mx.synchronize()
            t0 = time.perf_counter()
            prompt_lazily(batch, tokens, width)
            mx.eval([c.state for c in batch.prompt_cache])
            t1 = time.perf_counter()
            gen = batch.generate([[5]] * rows)
            mx.eval(gen._next_tokens)
            t2 = time.perf_counter()
        took.append(t1 - t0)
        first.append(t2 - t1)
    return 1e3 * statistics.median(took[2:]), 1e3 * statistics.median(first[2:])


def timed(cls: Any, name: str, sink: Callable[[str, float], None]) -> None:
    inner = getattr(cls, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            sink(name, time.perf_counter() - t0)

    setattr(cls, name, wrapper)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--tokens", type=int, default=128)
    args = p.parse_args()
    model, tok = load_as_served(args.model)
    for rows in (1, 4, 8):
        ms, first = prefill_alone(model, rows, 96)
        print(
            f"prefill of {rows} rows at width 96, alone: {ms:.1f} ms; their first-token forward {first:.1f} ms"
        )
    book = PromptBook(None, load_tokenizer(Path(args.model)), False)
    prompts = [
        list(tok.apply_chat_template(book.get(i).messages, add_generation_prompt=True)) for i in range(256)
    ]
    phases: dict[str, float] = defaultdict(float)
    timed(runner_module.BatchRunner, "_release", lambda n, s: phases.__setitem__(n, phases[n] + s))
    timed(runner_module.BatchRunner, "_join", lambda n, s: phases.__setitem__(n, phases[n] + s))
    timed(
        runner_module, "prompt_lazily", lambda n, s: phases.__setitem__(n, phases[n] + s)
    )  # as the runner calls it
    timed(PromptProcessingBatch, "generate", lambda n, s: phases.__setitem__(n, phases[n] + s))
    per: dict[bool, dict[str, list[float]]] = {True: defaultdict(list), False: defaultdict(list)}
    step = runner_module.BatchRunner.step

    def watched(self: Any, plan: Any) -> Any:
        phases.clear()
        t0 = time.perf_counter()
        out = step(self, plan)
        whole = time.perf_counter() - t0
        joined = bool(plan.prefill)
        per[joined]["step"].append(whole)
        for k, v in phases.items():
            per[joined][k].append(v)
        per[joined]["rest (next)"].append(whole - phases.get("_release", 0) - phases.get("_join", 0))
        return out

    runner_module.BatchRunner.step = watched  # type: ignore[method-assign]
    bucket = builds_per_shape()  # as the server's runner
    run_level(model, tok, prompts, args.clients, 16, bucket_prefill=bucket)
    per[True].clear(), per[False].clear()
    from bench.step_profile import report

    print(report(run_level(model, tok, prompts, args.clients, args.tokens, bucket_prefill=bucket)))
    for joined in (True, False):
        steps = len(per[joined]["step"])
        parts = ", ".join(f"{k} {1e3 * sum(v) / max(steps, 1):.1f}" for k, v in per[joined].items())
        print(f"{'join' if joined else 'plain'} steps ({steps}), mean ms per step: {parts}")


if __name__ == "__main__":
    main()
