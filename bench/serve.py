"""serve: mlx-serve vs mlx_lm.server vs direct mlx-lm under N streaming clients.

Each round starts each server alone on a free port (the order alternates between rounds), warms
every client count up with C short requests, then runs C closed-loop clients sending streaming
greedy chat requests (each prompt distinct, so no prefix cache is flattered). Per client count:
requests ok/failed, dropped connections, TTFT p50/p95, per-stream decode p50 and the aggregate
tok/s (completion tokens over the level's wall time), medians over rounds; direct mlx-lm runs
`stream_generate` (1 client) and `batch_generate` at B = C in a process of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
from dataclasses import asdict
from typing import Any

from bench.common import REQUEST_MODEL, clients, log_dir, model_folder, server_names, server_spec
from bench.machine import describe
from bench.prompts import PromptBook, load_tokenizer
from bench.report import LevelSummary, level_table, median_summary, ratio_lines, summarize
from bench.runs import LoadPlan, run_direct, run_server

DEFAULTS = {"rounds": 2, "clients": "1,16,64", "max_tokens": 128}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt-tokens", type=int, default=None, help="pad prompts to about N tokens")
    p.add_argument(
        "--requests", type=int, default=None, help="requests per client count (default max(4, 2C))"
    )
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--same-prompt", action="store_true", help="one prompt for every request")
    p.add_argument("--direct", action=argparse.BooleanOptionalAction, default=True, help="run direct mlx-lm")
    p.add_argument(
        "--client-processes",
        type=int,
        default=max(1, (os.cpu_count() or 1) // 4),
        help="spread a level's clients over up to this many processes (one per 8 clients)",
    )


def direct_rates(direct: dict[str, Any]) -> dict[int, float]:
    """Direct mlx-lm's tok/s per client count: `stream_generate`'s decode at 1, `batch_generate`'s
    end-to-end rate (prefill included, as a server's aggregate is) at B."""
    rates: dict[int, float] = {}
    if direct.get("runs"):
        rates[1] = statistics.median(r["generation_tps"] for r in direct["runs"])
    for b, runs in (direct.get("batch") or {}).items():
        rates[int(b)] = statistics.median(r["generation_tokens"] / r["wall_s"] for r in runs)
    return rates


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = model_folder(args.model)
    machine = describe()
    print(machine.line(), flush=True)
    levels, names, logs = clients(args), server_names(args), log_dir(args, "serve")
    plan = LoadPlan(
        levels, args.requests, args.max_tokens, args.warmup, 16, REQUEST_MODEL, args.startup_timeout,
        args.client_processes,
    )  # fmt: skip
    book = PromptBook(args.prompt_tokens, load_tokenizer(model), args.same_prompt)
    print(f"model {model}; clients {levels}; {args.max_tokens} tokens a request; logs in {logs}", flush=True)
    direct: dict[str, Any] = {}
    if args.direct:
        direct = run_direct(model, book, plan, max(args.rounds, 3), [c for c in levels if c > 1])
        print(f"direct mlx-lm: {direct.get('error') or 'done'}", flush=True)
    rounds: dict[str, dict[int, list[LevelSummary]]] = {n: {} for n in names}
    for number in range(args.rounds):
        for name in names if number % 2 == 0 else names[::-1]:
            folder = logs / f"round{number + 1}"
            folder.mkdir(exist_ok=True)
            spec = server_spec(args, name, model, folder)
            outcome = asyncio.run(run_server(spec, plan, book, folder))
            if outcome.error:
                print(f"  {name} round {number + 1}: {outcome.error}", flush=True)
            for level in outcome.levels:
                rounds[name].setdefault(level.concurrency, []).append(summarize(name, level))
    rates = direct_rates(direct)
    by_level: dict[int, dict[str, LevelSummary]] = {}
    print(f"\n{machine.line()}\nmedians of {args.rounds} round(s); TTFT in ms, rates in tok/s")
    for c in levels:
        by_level[c] = {n: median_summary(rounds[n][c]) for n in names if rounds[n].get(c)}
        print(level_table(c, list(by_level[c].values()), rates.get(c)))
    print("\n".join(ratio_lines(by_level, rates)), flush=True)
    return {
        "machine": asdict(machine),
        "direct": direct,
        "rounds": {n: {c: [asdict(s) for s in ss] for c, ss in r.items()} for n, r in rounds.items()},
        "medians": {c: {n: asdict(s) for n, s in row.items()} for c, row in by_level.items()},
    }
