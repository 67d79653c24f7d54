"""Where a batched step's time goes, in process (no HTTP, no engine process).

    python -m bench.step_profile --model DIR [--clients 1,16,64] [--tokens 128] [--profile]

Closed loop through the scheduler and the batch runner, with the core's per-token text work
(a streaming detokenizer per row): C clients, 2C requests of `--tokens` greedy tokens, distinct
prompts. Per level: aggregate tok/s (generated tokens / wall), the decode rate of steps without
prefill (rows × steps / their time: what mlx-lm's `batch_generate` reports as generation tok/s),
and the share of wall time spent outside `runner.step` (the Python the GPU may wait on).
Each level runs once untimed first (kernel shapes compile on a GPU). `--profile` prints
cProfile's top functions for the last level.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.prompts import PromptBook, load_tokenizer
from bench.speculation import load_as_served
from engine.batch.runner import BatchRunner
from engine.batch.scheduler import Scheduler, SchedulerConfig
from engine.types import Request, SamplingParams


@dataclass(slots=True)
class Level:
    clients: int
    tokens: int = 0
    wall: float = 0.0
    in_step: float = 0.0
    decode_rows: int = 0
    decode_time: float = 0.0
    steps: int = 0
    prefill_steps: list[float] = field(default_factory=list)


def run_level(
    model: Any, tokenizer: Any, prompts: list[list[int]], clients: int, tokens: int, **runner_args: Any
) -> Level:
    sched = Scheduler(SchedulerConfig(max_running=max(clients, 1)), frozenset())
    runner = BatchRunner(model, **runner_args)
    total = 2 * clients
    sent, done, lvl = 0, 0, Level(clients)
    detok: dict[str, Any] = {}

    def send() -> None:
        nonlocal sent
        rid = f"r{sent}"
        sched.add(Request(rid, tuple(prompts[sent % len(prompts)]), SamplingParams(), tokens))
        detok[rid] = tokenizer.detokenizer
        sent += 1

    for _ in range(min(clients, total)):
        send()
    start = time.perf_counter()
    while sched.has_work:
        plan = sched.schedule()
        for sid in plan.admitted:
            seq = sched.get(sid)
            assert seq is not None
            runner.admit(seq.request)
        t0 = time.perf_counter()
        out = runner.step(plan)
        t1 = time.perf_counter()
        lvl.in_step += t1 - t0
        lvl.steps += 1
        if plan.prefill:
            lvl.prefill_steps.append(t1 - t0)
        elif out.tokens:
            lvl.decode_rows += len(out.tokens)
            lvl.decode_time += t1 - t0
        for u in sched.update(plan, out):
            lvl.tokens += 1
            d = detok[u.seq_id]
            d.add_token(u.token)
            _ = d.last_segment
            if u.finish is not None:
                del detok[u.seq_id]
                done += 1
                if sent < total:
                    send()
    lvl.wall = time.perf_counter() - start
    return lvl


def report(lvl: Level) -> str:
    pre = sorted(lvl.prefill_steps)
    p50 = pre[len(pre) // 2] * 1e3 if pre else 0.0
    return (
        f"C={lvl.clients:3d}: aggregate {lvl.tokens / lvl.wall:7.1f} tok/s  decode-only steps "
        f"{lvl.decode_rows / max(lvl.decode_time, 1e-9):7.1f} tok/s  outside runner.step "
        f"{100 * (1 - lvl.in_step / lvl.wall):4.1f}%  steps {lvl.steps} ({len(pre)} with prefill, p50 {p50:.1f} ms)"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--clients", default="1,16,64")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    model, tok = load_as_served(args.model)
    book = PromptBook(None, load_tokenizer(Path(args.model)), False)
    prompts = [
        list(tok.apply_chat_template(book.get(i).messages, add_generation_prompt=True)) for i in range(128)
    ]
    levels = [int(c) for c in args.clients.split(",")]
    for c in levels:
        run_level(model, tok, prompts, c, 16)  # warm-up: this level's shapes
        for _ in range(args.rounds):
            print(report(run_level(model, tok, prompts, c, args.tokens)), flush=True)
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run_level(model, tok, prompts, levels[-1], args.tokens)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
