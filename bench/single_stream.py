"""One stream, interleaved: direct mlx-lm, our engine in process, and the servers over HTTP.

    python -m bench.single_stream --model DIR [--tokens 128] [--rounds 5] [--servers mlx-serve,mlx_lm]
        [--mlx-serve-args '...']

A shared host's speed drifts by tens of percent over minutes (the H200 hosts did), so measuring
each contender in its own stretch of time compares the drift, not the code. Here every round
runs each contender once, back to back, on the same prompt: direct `stream_generate` and our
scheduler + batch runner in this process (and once more with the lone row on batch caches) (the model loaded once), then one streaming chat
request to each server (started once, healthy, warmed up). Every decode rate is counted the
same way: tokens after the first over the time from the first token to the last (on the client,
for HTTP). Reported: per contender the median decode rate, and per round its ratio to that
round's direct run (median and range over rounds). Greedy; the same prompt every time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import orjson
from mlx_lm.generate import stream_generate

from bench.load import RequestRecord, read_stream
from bench.lone_stream import engine
from bench.report import percentile
from bench.servers import RunningServer, ServerSpec, server_cwd, start_server, stop_server, wait_healthy
from bench.speculation import load_as_served

MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


def is_text_chunk(line: str) -> bool:
    """An SSE line of a chat stream that carries generated text. Not the role chunk mlx-serve
    sends at once (`"content":""`, before the prompt is even prefilled): timed from it, a decode
    rate would include the time to first token, which `stream_generate`'s does not."""
    return line.startswith("data: {") and '"content":"' in line and '"content":""' not in line


def rate(times: list[float]) -> float:
    """Tokens after the first over the time from the first to the last."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0


def direct(model: Any, tokenizer: Any, prompt: list[int], n: int) -> float:
    return rate([time.perf_counter() for _ in stream_generate(model, tokenizer, prompt, max_tokens=n)])


async def over_http(client: httpx.AsyncClient, n: int) -> float:
    # "default_model": the model each server was started with (mlx_lm.server loads any other name)
    body = {
        "model": "default_model",
        "messages": MESSAGES,
        "max_tokens": n,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    record = RequestRecord(0, 0, time.perf_counter())
    async with client.stream(
        "POST",
        "/v1/chat/completions",
        content=orjson.dumps(body),
        headers={"content-type": "application/json"},
    ) as response:
        response.raise_for_status()
        await read_stream(response, record)
    return record.decode_tps or 0.0


async def main(args: argparse.Namespace) -> None:
    model, tokenizer = load_as_served(args.model)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    names = [s for s in args.servers.split(",") if s]
    rates: dict[str, list[float]] = {
        "direct": [],
        "in process": [],
        "batch cache": [],
        **{s: [] for s in names},
    }
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[str, httpx.AsyncClient] = {}
        log_dir = Path(tempfile.mkdtemp(prefix="single-stream-"))
        for name in names:
            extra = args.mlx_serve_args.split() if name == "mlx-serve" else []
            spec = ServerSpec(name, Path(args.model), extra, dict(os.environ), server_cwd(name, log_dir))
            server: RunningServer = start_server(spec, log_dir / f"{name}.log")
            stack.callback(stop_server, server)
            await wait_healthy(server, 900)
            clients[name] = await stack.enter_async_context(
                httpx.AsyncClient(base_url=server.base_url, timeout=900)
            )
        local: dict[str, Callable[[], float]] = {
            "direct": lambda: direct(model, tokenizer, prompt, args.tokens),
            "in process": lambda: engine(model, prompt, args.tokens),
            # the same engine with the lone row kept on mlx-lm's batch caches (engine.rows.lone_row off)
            "batch cache": lambda: engine(model, prompt, args.tokens, lone_row=False),
        }
        for _ in range(2):  # warm-up: every shape of a run compiles once
            for fn in local.values():
                fn()
            for client in clients.values():
                await over_http(client, args.tokens)
        for _ in range(args.rounds):
            for name, fn in local.items():
                rates[name].append(fn())
            for name, client in clients.items():
                rates[name].append(await over_http(client, args.tokens))
    print(
        f"device {mx.default_device()}  model {args.model}  {args.tokens} tokens  {args.rounds} rounds, interleaved"
    )
    for name, rs in rates.items():
        print(rate_line(name, rs, rates["direct"]), flush=True)


def rate_line(name: str, rs: list[float], reference: list[float], width: int = 11) -> str:
    """A contender's median decode rate [range] and, unless it is the reference, its ratio to the
    reference round by round: median [range]."""
    line = f"  {name:<{width}} decode {statistics.median(rs):8.1f} tok/s [{min(rs):.1f}-{max(rs):.1f}]"
    if rs is not reference:
        ratios = [r / d for r, d in zip(rs, reference, strict=True)]
        line += f"  {statistics.median(ratios):.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]"
        if len(ratios) >= 20:
            lo, hi = median_interval(ratios)
            line += f" 95% CI of the median {lo:.3f}-{hi:.3f}"
    return line


def median_interval(xs: list[float], draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval for the median of `xs` (percentile method, fixed seed): how far
    the median ratio of a run could move on rounds drawn from the same machine's spread."""
    rng = random.Random(seed)
    meds = [statistics.median(rng.choices(xs, k=len(xs))) for _ in range(draws)]
    lo, hi = percentile(meds, 2.5), percentile(meds, 97.5)
    assert lo is not None and hi is not None
    return lo, hi


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--servers", default="mlx-serve,mlx_lm")
    p.add_argument("--mlx-serve-args", default="", help="extra mlx-serve flags, space-separated")
    asyncio.run(main(p.parse_args()))
