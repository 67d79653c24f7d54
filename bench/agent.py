"""agent: agent sessions — a long system prompt, then turns that resend the whole conversation.

Session A: a system prompt of --system-tokens (12k and 30k are the usual sizes) built from the
model's real tokenizer, then --turns requests, each the conversation so far plus about
--turn-tokens new tokens. Per turn and server: TTFT, and the cached tokens the server reports
(usage.prompt_tokens_details.cached_tokens, or Anthropic's cache_read_input_tokens). The floor
is direct mlx-lm's prefill of that turn's new tokens on top of the previous turn's cache (in
this process, before any server starts). Then session B (the same system prompt under another
first line, as an agent's per-session header differs) sends its first turn, and after a
restart of the server the last turn of A is sent again: its TTFT against the cold prefill of
the whole prompt. --replay FILE sends a recorded session instead (a JSON list of
{"route", "body"}); the floor then needs chat bodies. Each round starts fresh servers; medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.agent_client import TurnResult, send
from bench.agent_floor import prefill_floor
from bench.agent_sessions import AgentRequest, build_session, read_fixture
from bench.common import log_dir, model_folder, server_names, server_spec, serving
from bench.machine import describe
from bench.report import fmt, ratio
from bench.servers import ServerSpec

DEFAULTS = {"rounds": 1, "max_tokens": 16}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--system-tokens", type=int, default=12_000, help="system prompt size (e.g. 12000, 30000)")
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--turn-tokens", type=int, default=400, help="new tokens a turn")
    p.add_argument("--replay", type=Path, default=None, help="a recorded session: JSON list of {route, body}")


@dataclass(slots=True)
class ServerRun:
    """One server in one round: session A's turns, session B's first, A's last after a restart."""

    turns: list[TurnResult] = field(default_factory=list)
    second_session: TurnResult | None = None
    after_restart: TurnResult | None = None


def sessions(args: argparse.Namespace, model: Path) -> tuple[list[AgentRequest], list[AgentRequest]]:
    if args.replay:
        return read_fixture(args.replay), []
    from bench.prompts import load_tokenizer

    tokenizer = load_tokenizer(model)
    if tokenizer is None:
        raise SystemExit(f"agent: no tokenizer in {model} to build the session with")
    build = (tokenizer, args.system_tokens, args.turns, args.turn_tokens)
    a = build_session(*build, first_line="Session 1 cch=5f2a1", max_tokens=args.max_tokens)  # type: ignore[arg-type]
    b = build_session(*build[:2], 1, args.turn_tokens, "Session 2 cch=9c4e7", args.max_tokens)  # type: ignore[arg-type]
    return a, b


async def send_all(
    args: argparse.Namespace, spec: ServerSpec, log: Path, requests: list[AgentRequest]
) -> list[TurnResult]:
    """Start the server, send `requests` one after another, stop it."""
    async with (
        serving(spec, log, args.startup_timeout) as server,
        httpx.AsyncClient(base_url=server.base_url, timeout=args.startup_timeout) as client,
    ):
        return [await send(client, request) for request in requests]


async def one_server(
    args: argparse.Namespace, name: str, model: Path, logs: Path, a: list[AgentRequest], b: list[AgentRequest]
) -> ServerRun:
    extra = ""
    if name == "mlx-serve" and "--prompt-cache-dir" not in args.mlx_serve_args:
        # a disk tier of its own each round, kept across the restart: turn 1 is cold, the restart is not
        extra = f"--prompt-cache-dir {tempfile.mkdtemp(dir=logs, prefix='prompt-cache-')}"
    spec = server_spec(args, name, model, logs, extra)
    results = await send_all(args, spec, logs / f"{name}.log", a + b[:1])
    restarted = await send_all(args, spec, logs / f"{name}-restarted.log", a[-1:])
    return ServerRun(results[: len(a)], results[len(a)] if b else None, restarted[0])


def median_ms(results: Sequence[TurnResult | None]) -> float | None:
    times = [r.ttft_s * 1000 for r in results if r is not None and r.ttft_s is not None]
    return statistics.median(times) if times else None


def median_cached(results: Sequence[TurnResult | None]) -> float | None:
    counts = [r.cached_tokens for r in results if r is not None and r.cached_tokens is not None]
    return statistics.median(counts) if counts else None


def report(names: list[str], runs: dict[str, list[ServerRun]], floor: dict[str, Any]) -> list[str]:
    new, floors = floor.get("new_tokens", []), floor.get("turn_s", [])
    head = f"{'turn':>4} {'prompt':>7} {'new':>6} {'floor ms':>9}" + "".join(
        f" {n + ' TTFT':>15} {'cached':>7}" for n in names
    )
    lines = ["\nsession A, per turn (TTFT in ms; cached = prompt tokens the server says it reused)", head]
    for t in range(len(runs[names[0]][0].turns)):
        line = f"{t + 1:>4} {fmt(_at(floor.get('prompt_tokens', []), t), 0):>7} {fmt(_at(new, t), 0):>6} {fmt(_ms(_at(floors, t))):>9}"
        for n in names:
            at = [r.turns[t] for r in runs[n]]
            line += f" {fmt(median_ms(at)):>15} {fmt(median_cached(at), 0):>7}"
        lines.append(line)
    for n in names:
        errors = {r.error for run in runs[n] for r in run.turns if r.error}
        lines += [f"  {n} error: {e}" for e in sorted(errors)[:3]]
    cold = _ms(floor.get("whole_last_s"))
    for n in names:
        ttfts = [median_ms([r.turns[t] for r in runs[n]]) for t in range(1, len(runs[n][0].turns))]
        later = [v for v in ttfts if v is not None]
        b, restart = (
            median_ms([r.second_session for r in runs[n]]),
            median_ms([r.after_restart for r in runs[n]]),
        )
        lines.append(
            f"{n}: turns 2+ TTFT median {fmt(statistics.median(later) if later else None)} ms "
            f"({fmt(ratio(statistics.median(later) if later else None, _ms(statistics.median(floors[1:]) if floors[1:] else None)), 2)}x the floor); "
            f"session B first turn {fmt(b)} ms, cached {fmt(median_cached([r.second_session for r in runs[n]]), 0)}; "
            f"after restart {fmt(restart)} ms, cached {fmt(median_cached([r.after_restart for r in runs[n]]), 0)} "
            f"({fmt(ratio(restart, cold), 2)}x the cold prefill of {fmt(cold)} ms)"
        )
    if len(names) == 2:
        ours, theirs = (
            [median_ms([r.turns[t] for r in runs[n]]) for t in range(1, len(runs[n][0].turns))] for n in names
        )
        pairs = [ratio(o, t) for o, t in zip(ours, theirs, strict=True)]
        got = [p for p in pairs if p is not None]
        lines.append(
            f"{names[0]} / {names[1]} TTFT, turns 2+: median {fmt(statistics.median(got) if got else None, 2)}x (lower is better)"
        )
    return lines


def _at(values: list[Any], index: int) -> Any:
    return values[index] if index < len(values) else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = model_folder(args.model)
    a, b = sessions(args, model)
    print(f"model {model}; session A: {len(a)} turns; session B: {len(b)} turn(s)", flush=True)
    floor = prefill_floor(model, [r.body for r in a])
    print(
        f"floor (direct mlx-lm prefill of each turn's new tokens): {floor.get('error') or 'done'}", flush=True
    )
    names, logs = server_names(args), log_dir(args, "agent")
    runs: dict[str, list[ServerRun]] = {n: [] for n in names}
    for number in range(args.rounds):
        for name in names if number % 2 == 0 else names[::-1]:
            folder = logs / f"round{number + 1}"
            folder.mkdir(exist_ok=True)
            runs[name].append(asyncio.run(one_server(args, name, model, folder, a, b)))
            print(f"  {name} round {number + 1} done", flush=True)
    machine = describe()
    print(f"\n{machine.line()}\nmodel {model}; medians of {args.rounds} round(s)")
    print("\n".join(report(names, runs, floor)), flush=True)
    return {
        "machine": asdict(machine),
        "floor": floor,
        "runs": {n: [asdict(r) for r in rs] for n, rs in runs.items()},
    }
