"""mixed: N decoding streams, then one long prompt arrives: what its prefill does to the streams.

Per server and round: the long prompt alone first (its TTFT, nothing else running); then N
streaming greedy requests, and once each has --before-tokens tokens a long prompt of the same
length (another variant, so no prefix cache helps) is sent. Reported: the streams' inter-token
gaps p50 / p99 / max before it arrived and during its prefill (gaps that overlap the span from
its send to its first token), and its TTFT beside its TTFT alone. Gaps are pooled over rounds;
TTFTs are medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import orjson

from bench.agent_client import carries_text
from bench.common import REQUEST_MODEL, clients, log_dir, model_folder, server_names, server_spec, serving
from bench.load import request_body
from bench.machine import describe
from bench.prompts import Prompt, build_prompt, load_tokenizer
from bench.report import fmt, gap_stats, ratio

DEFAULTS = {"rounds": 3, "clients": "8", "max_tokens": 256}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--long-tokens", type=int, default=8000, help="the long prompt's length")
    p.add_argument("--before-tokens", type=int, default=16, help="tokens each stream has before it arrives")


@dataclass(slots=True)
class Stream:
    """The arrival times of one request's text chunks."""

    sent_s: float
    times: list[float] = field(default_factory=list)
    error: str | None = None


@dataclass(slots=True)
class MixedRound:
    alone_ttft_s: float | None = None
    mixed_ttft_s: float | None = None
    gaps_before_ms: list[float] = field(default_factory=list)
    gaps_during_ms: list[float] = field(default_factory=list)
    streams_outlasted: bool = True


async def stream(client: httpx.AsyncClient, prompt: Prompt, max_tokens: int, out: Stream) -> Stream:
    body = orjson.dumps(request_body(prompt, max_tokens, REQUEST_MODEL))
    headers = {"content-type": "application/json"}
    try:
        async with client.stream("POST", "/v1/chat/completions", content=body, headers=headers) as r:
            async for line in r.aiter_lines():
                data = line[5:].strip() if line.startswith("data:") else ""
                if data and data != "[DONE]" and carries_text(orjson.loads(data)):
                    out.times.append(time.perf_counter())
            out.error = None if r.status_code == 200 else f"HTTP {r.status_code}"
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]
    return out


def ttft(s: Stream) -> float | None:
    return s.times[0] - s.sent_s if s.times else None


def split_gaps(streams: list[Stream], sent: float, first: float) -> tuple[list[float], list[float]]:
    """(gaps that ended before `sent`, gaps that overlap [sent, first]), in ms."""
    before: list[float] = []
    during: list[float] = []
    for s in streams:
        for prev, cur in zip(s.times, s.times[1:], strict=False):
            if cur < sent:
                before.append((cur - prev) * 1000)
            elif prev <= first:
                during.append((cur - prev) * 1000)
    return before, during


async def one_round(
    client: httpx.AsyncClient, args: argparse.Namespace, book: dict[str, Prompt], n: int
) -> MixedRound:
    out = MixedRound()
    out.alone_ttft_s = ttft(await stream(client, book["alone"], 1, Stream(time.perf_counter())))
    streams = [Stream(time.perf_counter()) for _ in range(n)]
    tasks = [
        asyncio.create_task(stream(client, book[f"s{i}"], args.max_tokens, s)) for i, s in enumerate(streams)
    ]
    while any(len(s.times) < args.before_tokens for s in streams) and not all(t.done() for t in tasks):
        await asyncio.sleep(0.005)
    long = await stream(client, book["long"], 1, Stream(time.perf_counter()))
    await asyncio.gather(*tasks)
    out.mixed_ttft_s = ttft(long)
    if long.times:
        out.gaps_before_ms, out.gaps_during_ms = split_gaps(streams, long.sent_s, long.times[0])
        out.streams_outlasted = all(s.times and s.times[-1] >= long.times[0] for s in streams)
    return out


async def one_server(
    args: argparse.Namespace, name: str, model: Any, books: list[dict[str, Prompt]], n: int
) -> list[MixedRound]:
    logs = log_dir(args, "mixed")
    spec = server_spec(args, name, model, logs)
    async with (
        serving(spec, logs / f"{name}.log", args.startup_timeout) as server,
        httpx.AsyncClient(
            base_url=server.base_url, timeout=args.startup_timeout, limits=httpx.Limits(max_connections=n + 2)
        ) as client,
    ):
        await stream(client, books[0]["s0"], 8, Stream(time.perf_counter()))  # warm
        return [await one_round(client, args, book, n) for book in books]


def prompt_books(args: argparse.Namespace, model: Any, n: int) -> list[dict[str, Prompt]]:
    tokenizer = load_tokenizer(model)
    books = []
    for r in range(args.rounds):
        base = 100_000 * (r + 1)
        book = {f"s{i}": build_prompt(base + i, None, tokenizer) for i in range(n)}
        book["alone"] = build_prompt(base + 90_000, args.long_tokens, tokenizer)
        book["long"] = build_prompt(base + 90_001, args.long_tokens, tokenizer)
        books.append(book)
    return books


def lines(name: str, rounds: list[MixedRound]) -> list[str]:
    before = [g for r in rounds for g in r.gaps_before_ms]
    during = [g for r in rounds for g in r.gaps_during_ms]
    alone = [r.alone_ttft_s * 1000 for r in rounds if r.alone_ttft_s is not None]
    mixed = [r.mixed_ttft_s * 1000 for r in rounds if r.mixed_ttft_s is not None]
    a, m = (statistics.median(x) if x else None for x in (alone, mixed))
    note = "" if all(r.streams_outlasted for r in rounds) else "  (some streams ended before its first token)"
    return [
        f"{name}:",
        f"  streams' gaps before   {gap_stats(before)}",
        f"  streams' gaps during   {gap_stats(during)}{note}",
        f"  long prompt TTFT       {fmt(m)} ms with the streams, {fmt(a)} ms alone ({fmt(ratio(m, a), 2)}x)",
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = model_folder(args.model)
    n = clients(args)[0]
    books = prompt_books(args, model, n)
    print(f"model {model}; {n} streams; long prompt {books[0]['long'].num_tokens} tokens", flush=True)
    results = {name: asyncio.run(one_server(args, name, model, books, n)) for name in server_names(args)}
    machine = describe()
    print(f"\n{machine.line()}\n{n} streams of {args.max_tokens} tokens; {args.rounds} round(s)")
    for name, rounds in results.items():
        print("\n".join(lines(name, rounds)), flush=True)
    return {"machine": asdict(machine), "rounds": {k: [asdict(r) for r in v] for k, v in results.items()}}
