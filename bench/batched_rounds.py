"""Batched serving against mlx-lm's `batch_generate`, interleaved round by round (issue 19 item 2).

    python -m bench.batched_rounds --model DIR [--levels 16,64] [--requests 256] [--tokens 128]
        [--rounds 3] [--mlx-serve-args '...'] [--baseline DIR]

A shared host's speed drifts by tens of percent over minutes, so each round runs, per level C,
mlx-serve over HTTP (C closed-loop streaming clients, N greedy requests) and then, in this
process, `batch_generate` on the same N prompts with C decoding at a time (`completion_batch_size`
= C: as each row finishes the next prompt is prefilled and joins, as the server's clients do).
Both are counted the same way, end to end: completion tokens over wall time, prefill of the
joins included. `batch_generate`'s own decode rate (its stats, prefill left out) is printed too,
and so is its one-wave figure (C prompts, all prefilled first) that earlier runs compared with.
Reported per level: the medians, and the median and range of the per-round ratios. With
--baseline DIR (another checkout of mlx-serve, e.g. a `git worktree` of an earlier commit), that
server runs in the same rounds too, so a change is measured against its parent on the same host
minutes. Each level's line also gives the engine's own account from /stats over that level: its
mean batch width (decoding rows per step), the share of steps that carried prefill, and the mean
step time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.load import run_level
from bench.prompts import PromptBook, load_tokenizer
from bench.report import summarize
from bench.runs import LoadPlan, level_spec
from bench.servers import RunningServer, ServerSpec, server_cwd, start_server, stop_server, wait_healthy


def batch_rates(
    model: Any, tokenizer: Any, prompts: list[list[int]], width: int, tokens: int
) -> dict[str, float]:
    """`batch_generate` on `prompts`, `width` at a time: end-to-end and decode-only tok/s."""
    from mlx_lm import batch_generate

    start = time.perf_counter()
    response = batch_generate(
        model,
        tokenizer,
        prompts,
        max_tokens=tokens,
        completion_batch_size=width,
        prefill_batch_size=min(width, 8),
    )
    wall = time.perf_counter() - start
    return {"end_to_end": response.stats.generation_tokens / wall, "decode": response.stats.generation_tps}


async def engine_stats(server: RunningServer) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        return dict((await client.get(server.base_url + "/stats")).json())


def engine_account(before: dict[str, Any], after: dict[str, Any]) -> str:
    """The engine's counters over one level: mean batch width, join share, mean step time."""
    if "engine_steps" not in after:
        return "(no step counters)"
    steps = after["engine_steps"] - before.get("engine_steps", 0)
    if steps <= 0:
        return "(no steps)"
    rows = after["engine_step_rows"] - before.get("engine_step_rows", 0)
    joins = after["engine_join_steps"] - before.get("engine_join_steps", 0)
    took = after["engine_step_seconds"] - before.get("engine_step_seconds", 0.0)
    join_took = after["engine_join_step_seconds"] - before.get("engine_join_step_seconds", 0.0)
    plain = steps - joins
    return (
        f"width {rows / steps:.1f}, {steps} steps, {joins / steps:.0%} with prefill, "
        f"step {1000 * (took - join_took) / max(plain, 1):.1f} ms plain / "
        f"{1000 * join_took / max(joins, 1):.1f} ms with prefill"
    )


async def ours(
    server: RunningServer, plan: LoadPlan, book: PromptBook, number: int, width: int
) -> tuple[float, str]:
    before = await engine_stats(server)
    level = await run_level(
        server.base_url, level_spec(plan, book, number, width, False), plan.processes_for(width)
    )
    summary = summarize("mlx-serve", level)
    if summary.errors:
        raise RuntimeError(f"mlx-serve C={width}: {summary.errors} failed: {summary.error_samples}")
    return summary.aggregate_tps, engine_account(before, await engine_stats(server))


async def main(args: argparse.Namespace) -> None:
    from mlx_lm import load

    levels = [int(c) for c in args.levels.split(",")]
    plan = LoadPlan(levels, args.requests, args.tokens, True, 16, "default_model", 900.0, client_processes=8)
    book = PromptBook(None, load_tokenizer(Path(args.model)), False)
    model, tokenizer = load(args.model)[:2]

    def prompt_ids(number: int, count: int) -> list[list[int]]:
        first = level_spec(plan, book, number, 1, False).first_index  # the indices the clients send
        return [
            list(tokenizer.apply_chat_template(book.get(first + i).messages, add_generation_prompt=True))
            for i in range(count)
        ]

    log_dir = Path(tempfile.mkdtemp(prefix="batched-rounds-"))
    checkouts = {"mlx-serve": server_cwd("mlx-serve", log_dir)}
    if args.baseline:
        checkouts["baseline"] = Path(args.baseline).resolve()
    servers = {
        name: start_server(
            ServerSpec("mlx-serve", Path(args.model), args.mlx_serve_args.split(), dict(os.environ), cwd),
            log_dir / f"{name}.log",
        )
        for name, cwd in checkouts.items()
    }
    rows: dict[int, dict[str, list[float]]] = {
        c: {"ours": [], "baseline": [], "e2e": [], "decode": [], "wave": []} for c in levels
    }
    try:
        for server in servers.values():
            await wait_healthy(server, 900)
        # round 0 warms every shape on every side; each round and level has prompts of its own
        # (the server's prefix cache would otherwise skip the prefill batch_generate pays)
        for r in range(args.rounds + 1):
            for i, width in enumerate(levels):
                number = 1 + r * len(levels) + i
                served: dict[str, tuple[float, str]] = {}
                for name, server in servers.items():
                    served[name] = await ours(server, plan, book, number, width)
                rates = batch_rates(model, tokenizer, prompt_ids(number, args.requests), width, args.tokens)
                wave = batch_rates(model, tokenizer, prompt_ids(number, width), width, args.tokens)["decode"]
                if r == 0:
                    continue
                row = rows[width]
                row["ours"].append(served["mlx-serve"][0])
                if "baseline" in served:
                    row["baseline"].append(served["baseline"][0])
                row["e2e"].append(rates["end_to_end"])
                row["decode"].append(rates["decode"])
                row["wave"].append(wave)
                for name, (tps, account) in served.items():
                    print(f"round {r} C={width}: {name} {tps:,.0f} tok/s; engine: {account}", flush=True)
                print(
                    f"round {r} C={width}: batch_generate {args.requests} "
                    f"prompts end to end {rates['end_to_end']:,.0f}, decode {rates['decode']:,.0f}; "
                    f"one wave of {width} decode {wave:,.0f}",
                    flush=True,
                )
    finally:
        for server in servers.values():
            stop_server(server)
    print(
        f"model {args.model}  {args.requests} requests x {args.tokens} tokens  {args.rounds} rounds, interleaved"
    )
    for width, row in rows.items():
        for key, label in (
            *((("baseline", f"baseline {args.baseline}"),) if args.baseline else ()),
            ("e2e", "batch_generate end to end"),
            ("decode", "batch_generate decode-only"),
            ("wave", f"one wave of {width}, decode-only"),
        ):
            ratios = [o / b for o, b in zip(row["ours"], row[key], strict=True)]
            print(
                f"  C={width}: mlx-serve {statistics.median(row['ours']):,.0f} tok/s / {label} "
                f"{statistics.median(row[key]):,.0f}: {statistics.median(ratios):.2f}x "
                f"[{min(ratios):.2f}-{max(ratios):.2f}]",
                flush=True,
            )


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--levels", default="16,64")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mlx-serve-args", default="", help="extra mlx-serve flags, space-separated")
    p.add_argument("--baseline", default="", help="another mlx-serve checkout to run in the same rounds")
    asyncio.run(main(p.parse_args()))
