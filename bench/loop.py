"""loop: event-loop latency — GET /health's time while idle, under load, and while a huge body is refused.

A prober process of its own (bench.health_probe) sends GET /health every 10 ms on one kept-alive
connection. Per server: idle for --idle-s; while C streaming clients run closed-loop; and (mlx-serve
only: mlx_lm.server has no context check and would try to prefill it) while a --huge-mb MB chat
request, sent by curl from its own process, is refused. Prints p50 / p99 / max of each phase,
pooled over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from bench.common import REQUEST_MODEL, clients, log_dir, model_folder, server_names, server_spec, serving
from bench.load import LoadSpec, run_level
from bench.machine import describe
from bench.prompts import PromptBook
from bench.report import gap_stats
from bench.runs import health_probe

DEFAULTS = {"rounds": 3, "clients": "16", "max_tokens": 64}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--idle-s", type=float, default=3.0)
    p.add_argument("--huge-mb", type=int, default=30, help="the refused body's size (0: skip)")


async def refuse_huge(url: str, megabytes: int) -> str:
    """Send a chat body of `megabytes` MB from curl; its HTTP status."""
    text = "All work and no play makes Jack a dull boy. " * (megabytes * 2**20 // 44)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(
            orjson.dumps(
                {"model": REQUEST_MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 8}
            )
        )
        f.flush()
        del text
        curl = await asyncio.create_subprocess_exec(
            *("curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "content-type: application/json"),
            *("--data-binary", f"@{f.name}", f"{url}/v1/chat/completions"),
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await curl.communicate()
    return out.decode() or "no answer"


async def one_round(args: argparse.Namespace, name: str, url: str, number: int) -> dict[str, list[float]]:
    phases: dict[str, list[float]] = {}
    with health_probe(url) as probes:
        await asyncio.sleep(args.idle_s)
    phases["idle"] = probes
    c = clients(args)[0]
    book = PromptBook(None, None, same_prompt=False)
    spec = LoadSpec(c, 2 * c, args.max_tokens, 1_000_000 * (number + 1), REQUEST_MODEL, book.get)
    with health_probe(url) as probes:
        level = await run_level(url, spec)
    phases[f"{c} streams"] = probes
    print(
        f"  {name} round {number + 1}: {sum(r.ok for r in level.records)}/{len(level.records)} streams ok",
        flush=True,
    )
    if args.huge_mb and name == "mlx-serve":
        with health_probe(url) as probes:
            began = time.perf_counter()
            status = await refuse_huge(url, args.huge_mb)
        print(
            f"  {name} round {number + 1}: {args.huge_mb} MB body -> {status} in {time.perf_counter() - began:.2f} s",
            flush=True,
        )
        phases[f"{args.huge_mb} MB refused"] = probes
    return phases


async def one_server(args: argparse.Namespace, name: str, model: Path) -> dict[str, list[float]]:
    logs = log_dir(args, "loop")
    pooled: dict[str, list[float]] = {}
    async with serving(
        server_spec(args, name, model, logs), logs / f"{name}.log", args.startup_timeout
    ) as server:
        for number in range(args.rounds):
            for phase, probes in (await one_round(args, name, server.base_url, number)).items():
                pooled.setdefault(phase, []).extend(probes)
    return pooled


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = model_folder(args.model)
    results = {name: asyncio.run(one_server(args, name, model)) for name in server_names(args)}
    machine = describe()
    print(f"\n{machine.line()}\nmodel {model}; GET /health every 10 ms, {args.rounds} round(s) pooled")
    for name, phases in results.items():
        for phase, probes in phases.items():
            print(f"  {name:<10} {phase:<14} {gap_stats(probes)}")
    return {"machine": asdict(machine), "health_ms": results}
