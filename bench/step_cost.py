"""Where a speculative step's time goes, at one batch size and context length (a diagnostic).

    python -m bench.step_cost --model DIR [--rows 16] [--context 512] [--width 4] [--steps 30]

Fills a batch of `rows` rows with `context`-token prompts, then times, each synchronously and
averaged over `steps`: a plain decode step (pipelined, as served), the verify forward alone (one
target forward of `width` tokens a row), cutting rejected positions from the KV cache with
acceptances that differ by row (engine.cut_cache.cut_rows, and the roll it replaced), and the whole speculative step
with wrong drafts (every row cuts the same count, so
that step has no roll: add the cut line for a step whose rows accept differently). Ratios to the plain step say what speculation must win back.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, dynamic_roll

from bench.speculation import load_as_served
from engine.batch.runner import BatchRunner
from engine.batch.scheduler import Scheduler, SchedulerConfig
from engine.speculation.cut_cache import cut_rows
from engine.speculation.drafting import Draft
from engine.types import Request, SamplingParams


def filled_runner(model: Any, rows: int, context: int, eos: frozenset[int]) -> BatchRunner:
    runner = BatchRunner(model)
    sched = Scheduler(SchedulerConfig(max_running=rows, token_budget=max(2048, context)), eos)
    rng = random.Random(0)
    for i in range(rows):
        sched.add(
            Request(
                f"r{i}", tuple(rng.randrange(1000, 20000) for _ in range(context)), SamplingParams(), 10_000
            )
        )
    while runner.num_rows < rows:
        plan = sched.schedule()
        for sid in plan.admitted:
            runner.admit(sched.get(sid).request)  # type: ignore[union-attr]
        sched.update(plan, runner.step(plan))
    return runner


def rolled_cut(caches: list[Any], cut: list[int]) -> None:
    """The cut this replaced (before df4ce73), as a baseline: every row's cache rolled right by
    its extra cut, the tail becoming left padding, shared padding then sliced off."""
    low, high = min(cut), max(cut)
    shift = mx.array([c - low for c in cut])
    for c in caches:
        c.trim(low)
        if high == low:
            continue
        keys, values = c.keys[..., : c._idx, :], c.values[..., : c._idx, :]
        c.keys = dynamic_roll(keys, shift[:, None], axis=2)
        c.values = dynamic_roll(values, shift[:, None], axis=2)
        c.offset, c.left_padding = c.offset - shift, c.left_padding + shift
        common = min(c.left_padding.tolist())
        if common:
            c.keys, c.values = c.keys[..., common:, :], c.values[..., common:, :]
            c._idx, c.left_padding = c._idx - common, c.left_padding - common


def timed(fn: Callable[[], Any], steps: int) -> float:
    for _ in range(3):
        fn()
    began = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - began) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--width", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    model, tokenizer = load_as_served(args.model)
    eos = frozenset(tokenizer.eos_token_ids)
    runner = filled_runner(model, args.rows, args.context, eos)
    gen: Any = runner._gen
    k, rng = args.width - 1, random.Random(1)

    def plain() -> None:
        gen.next()

    def forward_keeping(kept: int) -> Callable[[], None]:
        def forward() -> None:
            inputs = mx.zeros((args.rows, args.width), dtype=mx.uint32)
            logits = model(inputs, cache=gen.prompt_cache)
            mx.eval(logits)
            cut_rows(gen.prompt_cache, [args.width - kept] * args.rows)  # the same cut for all: no holes

        return forward

    def cut_with(how: Callable[[list[Any], list[int]], None], caches: list[Any]) -> Callable[[], None]:
        def cut() -> None:
            for c in caches:  # write `width` positions, then cut a different count per row
                c.update_and_fetch(
                    *(
                        mx.zeros((args.rows, c.keys.shape[1], args.width, a.shape[-1]), a.dtype)
                        for a in (c.keys, c.values)
                    )
                )
            how(caches, [rng.randint(1, args.width) for _ in range(args.rows)])
            mx.eval([c.state[:4] for c in caches])

        return cut

    # the baseline rolls a copy of the batch caches (plain BatchKVCaches, as they were)
    copies: list[Any] = []
    for c in gen.prompt_cache:
        b = BatchKVCache([0] * args.rows)
        b.keys, b.values, b.offset, b.left_padding, b._idx = c.state
        copies.append(b)

    def speculate() -> None:
        gen.speculate([Draft(None, [rng.randrange(1000, 20000) for _ in range(k)]) for _ in range(args.rows)])

    def speculate_undrafted() -> None:
        gen.speculate([None] * args.rows)

    parts = {
        "plain step (pipelined)": plain,
        "verify forward": forward_keeping(0),
        "verify forward, grows 1": forward_keeping(1),
        "cut rows (holes)": cut_with(cut_rows, gen.prompt_cache),
        "cut rows (rolled, old)": cut_with(rolled_cut, copies),
        "speculative step": speculate,
        "speculative, no drafts": speculate_undrafted,
    }
    cost = {name: timed(fn, args.steps) for name, fn in parts.items()}
    print(
        f"device {mx.default_device()}  model {args.model}  rows {args.rows}  context {args.context}  "
        f"width {args.width}"
    )
    for name, s in cost.items():
        print(f"  {name:<24} {1000 * s:8.2f} ms  {s / cost['plain step (pipelined)']:5.2f}x plain")


if __name__ == "__main__":
    main()
