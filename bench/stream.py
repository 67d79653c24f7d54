"""stream: one stream, mlx-serve over HTTP vs mlx_lm.server over HTTP vs `stream_generate` direct.

A shared host's speed drifts by tens of percent over minutes, so every round runs each
contender once, back to back, on the same prompt: direct `stream_generate` in this process (the
model loaded as the server loads it), then one streaming greedy chat request to each server
(started once, healthy, warmed). Every decode rate counts the same way: tokens after the first
over the time from the first token to the last (on the client, for HTTP; timed from the first
chunk that carries text, not a role chunk sent before the prefill). Prints each contender's
median rate and its ratio to that round's direct run (median and range; a 95% interval of the
median from 20 rounds).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from dataclasses import asdict
from typing import Any

import httpx
import orjson

from bench.common import (
    REQUEST_MODEL,
    load_as_served,
    log_dir,
    model_folder,
    server_names,
    server_spec,
    serving,
)
from bench.load import RequestRecord, read_stream
from bench.machine import describe
from bench.report import rate_line

DEFAULTS = {"rounds": 5, "max_tokens": 256}
MESSAGES = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--warmup-rounds", type=int, default=2)


def rate(times: list[float]) -> float:
    """Tokens after the first over the time from the first to the last."""
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else 0.0


def direct(model: Any, tokenizer: Any, prompt: list[int], n: int) -> float:
    from mlx_lm import stream_generate

    return rate([time.perf_counter() for _ in stream_generate(model, tokenizer, prompt, max_tokens=n)])


async def over_http(client: httpx.AsyncClient, n: int) -> float:
    body = {
        "model": REQUEST_MODEL,
        "messages": MESSAGES,
        "max_tokens": n,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    record = RequestRecord(0, 0, time.perf_counter())
    headers = {"content-type": "application/json"}
    async with client.stream(
        "POST", "/v1/chat/completions", content=orjson.dumps(body), headers=headers
    ) as r:
        r.raise_for_status()
        await read_stream(r, record)
    return record.decode_tps or 0.0


async def measure(args: argparse.Namespace, model_dir: Any) -> dict[str, list[float]]:
    model, tokenizer = load_as_served(model_dir)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    names, logs = server_names(args), log_dir(args, "stream")
    rates: dict[str, list[float]] = {"direct": [], **{n: [] for n in names}}
    async with contextlib.AsyncExitStack() as stack:
        clients: dict[str, httpx.AsyncClient] = {}
        for name in names:
            spec = server_spec(args, name, model_dir, logs)
            server = await stack.enter_async_context(
                serving(spec, logs / f"{name}.log", args.startup_timeout)
            )
            clients[name] = await stack.enter_async_context(
                httpx.AsyncClient(base_url=server.base_url, timeout=args.startup_timeout)
            )
        for number in range(args.warmup_rounds + args.rounds):
            measured = number >= args.warmup_rounds
            got = direct(model, tokenizer, prompt, args.max_tokens)
            if measured:
                rates["direct"].append(got)
            for name, client in clients.items():
                got = await over_http(client, args.max_tokens)
                if measured:
                    rates[name].append(got)
    return rates


def run(args: argparse.Namespace) -> dict[str, Any]:
    model_dir = model_folder(args.model)
    rates = asyncio.run(measure(args, model_dir))
    machine = describe()
    print(f"\n{machine.line()}")
    print(
        f"model {model_dir}; {args.max_tokens} tokens; {args.rounds} rounds, interleaved; decode rate, ratio to direct"
    )
    for name, rs in rates.items():
        print(rate_line(name, rs, rates["direct"]), flush=True)
    ratios = {
        n: statistics.median(r / d for r, d in zip(rs, rates["direct"], strict=True))
        for n, rs in rates.items()
    }
    return {"machine": asdict(machine), "rates": rates, "median_ratio_to_direct": ratios}
