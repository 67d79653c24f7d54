"""Closed-loop streaming load against an OpenAI-compatible chat endpoint.

C clients each send streaming chat requests back to back until K requests have been issued;
every request is timed from send to its first content chunk (TTFT) and to its last, and its
completion token count comes from the usage chunk (falling back to counting content chunks).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from bench.prompts import Prompt

CONNECT_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 900.0


@dataclass(slots=True)
class RequestRecord:
    """What one streamed request did; times are seconds on the monotonic clock."""

    index: int
    variant: int
    start_s: float
    status: int | None = None
    first_token_s: float | None = None
    last_token_s: float | None = None
    end_s: float | None = None
    content_chunks: int = 0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    got_done: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def num_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else self.content_chunks

    @property
    def decode_tps(self) -> float | None:
        """Tokens after the first over the time between the first and the last token."""
        if self.first_token_s is None or self.last_token_s is None or self.num_tokens < 2:
            return None
        span = self.last_token_s - self.first_token_s
        return (self.num_tokens - 1) / span if span > 0 else None


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """One concurrency level: C clients, K requests, each request's prompt by index."""

    concurrency: int
    num_requests: int
    max_tokens: int
    first_index: int
    model_field: str
    prompt_for: Callable[[int], Prompt]


@dataclass(slots=True)
class LevelResult:
    concurrency: int
    wall_s: float
    records: list[RequestRecord] = field(default_factory=list)


def request_body(prompt: Prompt, max_tokens: int, model_field: str) -> dict[str, object]:
    return {
        "model": model_field,
        "messages": prompt.messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def apply_chunk(record: RequestRecord, chunk: dict[str, object], now: float) -> None:
    """Fold one SSE JSON chunk into the record."""
    if "error" in chunk:
        record.error = f"in-band error: {str(chunk['error'])[:200]}"
        return
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        record.completion_tokens = usage.get("completion_tokens")
        record.prompt_tokens = usage.get("prompt_tokens")
    for choice in chunk.get("choices") or []:  # type: ignore[attr-defined]
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            record.content_chunks += 1
            record.first_token_s = record.first_token_s or now
            record.last_token_s = now
        record.finish_reason = choice.get("finish_reason") or record.finish_reason


async def read_stream(response: httpx.Response, record: RequestRecord) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            record.got_done = True
            continue
        apply_chunk(record, orjson.loads(data), time.perf_counter())


async def one_request(client: httpx.AsyncClient, url: str, spec: LoadSpec, index: int) -> RequestRecord:
    prompt = spec.prompt_for(index)
    record = RequestRecord(index=index, variant=prompt.variant, start_s=time.perf_counter())
    body = orjson.dumps(request_body(prompt, spec.max_tokens, spec.model_field))
    headers = {"content-type": "application/json"}
    try:
        async with client.stream("POST", url, content=body, headers=headers) as response:
            record.status = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                record.error = f"HTTP {response.status_code}: {text[:200]}"
            else:
                await read_stream(response, record)
    except Exception as exc:  # noqa: BLE001 - any failure is a counted error, never a crash
        record.error = f"{type(exc).__name__}: {exc}"[:300]
    record.end_s = time.perf_counter()
    if record.error is None and not record.got_done:
        record.error = "stream ended without [DONE]"
    return record


async def run_level(base_url: str, spec: LoadSpec, processes: int = 1) -> LevelResult:
    """Run one closed-loop level; wall time runs from the first send to the last completion.

    With `processes` > 1 the clients are spread over that many client processes (forked), so
    that reading many fast streams is not limited by one Python event loop: a client that
    falls behind would charge its own queueing to the server's TTFT.
    """
    if processes > 1 and spec.concurrency > 1:
        return await asyncio.to_thread(_run_level_forked, base_url, spec, min(processes, spec.concurrency))
    url = base_url.rstrip("/") + "/v1/chat/completions"
    indices = iter(range(spec.first_index, spec.first_index + spec.num_requests))
    start = time.perf_counter()
    records = await _clients(url, spec, [indices] * spec.concurrency)
    return LevelResult(spec.concurrency, time.perf_counter() - start, sorted(records, key=lambda r: r.index))


async def _clients(url: str, spec: LoadSpec, queues: list[Iterator[int]]) -> list[RequestRecord]:
    """One client per entry of `queues`, each sending its queue's requests back to back
    (entries may share one iterator: then the clients pull from it in turn)."""
    timeout = httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
    limits = httpx.Limits(max_connections=len(queues), max_keepalive_connections=len(queues))
    records: list[RequestRecord] = []

    async def client_loop(client: httpx.AsyncClient, queue: Iterator[int]) -> None:
        for index in queue:
            records.append(await one_request(client, url, spec, index))

    async with httpx.AsyncClient(http1=True, http2=False, timeout=timeout, limits=limits) as client:
        await asyncio.gather(*(client_loop(client, q) for q in queues))
    return records


def _run_level_forked(base_url: str, spec: LoadSpec, processes: int) -> LevelResult:
    """Client c sends requests first+c, first+c+C, ...; process w hosts clients w, w+P, ...
    All processes start sending at one agreed instant (CLOCK_MONOTONIC is machine-wide)."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    end = spec.first_index + spec.num_requests
    start_at = time.perf_counter() + 1.0
    ctx = mp.get_context("fork")  # forked children inherit spec (its prompt_for need not pickle)
    results = ctx.SimpleQueue()
    workers = [
        ctx.Process(
            target=_client_process,
            daemon=True,
            args=(
                url,
                spec,
                [
                    list(range(spec.first_index + c, end, spec.concurrency))
                    for c in range(w, spec.concurrency, processes)
                ],
                start_at,
                results,
            ),
        )
        for w in range(processes)
    ]
    for proc in workers:
        proc.start()
    parts = [results.get() for _ in workers]
    for proc in workers:
        proc.join()
    records = [r for part, _ in parts for r in part]
    wall = max(done for _, done in parts) - start_at
    return LevelResult(spec.concurrency, wall, sorted(records, key=lambda r: r.index))


def _client_process(url: str, spec: LoadSpec, queues: list[list[int]], start_at: float, results: Any) -> None:
    time.sleep(max(0.0, start_at - time.perf_counter()))
    records: list[RequestRecord] = []
    try:
        records = asyncio.run(_clients(url, spec, [iter(q) for q in queues]))
    finally:  # always answer, or the parent waits forever
        results.put((records, time.perf_counter()))
