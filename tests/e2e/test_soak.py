"""Tier 3: a soak (issue 15). 2,000 mixed requests against a real server, then nothing leaked.

The real server (Hypercorn, the engine in its child process) on a tiny random-weight llama
with SmolLM2's tokenizer and template, so 2,000 requests fit in a couple of minutes on a CPU.
Eight clients on loopback send every endpoint: JSON and SSE, n = 2, grammars, logprobs, tools
(offered and forced), Anthropic and Responses, count_tokens, and streams abandoned after the
first event. Every answer must be a 200 that completes (an abandoned one aside); at the end
nothing runs or waits, KV usage is back to 0, no request failed in the engine, and the RSS of
both processes is within RSS_TOLERANCE of what it was after the warm-up.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.server_proc import ServerProcess

REQUESTS = 2000
WARMUP = 200
CLIENTS = 8
RSS_TOLERANCE_BYTES = 32 << 20
USER = [{"role": "user", "content": "Tell me about the sea."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 8}},
    "required": ["answer"],
}


def mix() -> list[tuple[str, dict[str, Any], str]]:
    """(path, body, how): how is "json", "sse" or "cancel" (leave after the first event)."""
    chat = {"messages": USER, "max_tokens": 8}
    return [
        ("/v1/chat/completions", chat, "json"),
        ("/v1/chat/completions", {**chat, "stream": True, "stream_options": {"include_usage": True}}, "sse"),
        ("/v1/chat/completions", {**chat, "n": 2, "temperature": 0.8, "seed": 3}, "json"),
        ("/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 2}, "json"),
        (
            "/v1/chat/completions",
            {
                **chat,
                "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}},
            },
            "json",
        ),
        ("/v1/chat/completions", {**chat, "tools": TOOLS, "stream": True}, "sse"),
        (
            "/v1/chat/completions",
            {**chat, "tools": TOOLS, "tool_choice": "required", "max_tokens": 24},
            "json",
        ),
        ("/v1/chat/completions", {**chat, "max_tokens": 64, "stream": True}, "cancel"),
        ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "logprobs": 1}, "json"),
        ("/v1/completions", {"prompt": "The sea", "max_tokens": 8, "stream": True}, "sse"),
        ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": USER}, "json"),
        ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": USER, "stream": True}, "sse"),
        ("/v1/messages/count_tokens", {"model": "m", "messages": USER}, "json"),
        (
            "/v1/responses",
            {"input": "Tell me about the sea.", "max_output_tokens": 8, "store": False},
            "json",
        ),
        (
            "/v1/responses",
            {"input": "Tell me about the sea.", "max_output_tokens": 8, "stream": True, "store": False},
            "sse",
        ),
    ]


async def one(client: httpx.AsyncClient, path: str, body: dict[str, Any], how: str) -> str:
    """What happened: "ok", or what was wrong."""
    if how == "json":
        r = await client.post(path, json=body)
        if r.status_code != 200:
            return f"{path} {r.status_code} {r.text[:200]}"
        return "ok" if r.json().get("error") is None else f"{path} error {r.text[:200]}"
    async with client.stream("POST", path, json=body) as r:
        if r.status_code != 200:
            return f"{path} {r.status_code}"
        text = ""
        async for chunk in r.aiter_text():
            text += chunk
            if how == "cancel" and "data: " in text:
                return "ok"  # leave: the server must abort the generation
    if 'data: {"error"' in text or "event: error" in text or "response.failed" in text:
        return f"{path} in-band error {text[-200:]}"
    done = text.rstrip().endswith("[DONE]") or "event: message_stop" in text or "response.completed" in text
    return "ok" if done or "response.incomplete" in text else f"{path} unfinished {len(text)} {text[-300:]!r}"


async def traffic(url: str, count: int) -> list[str]:
    jobs = itertools.islice(itertools.cycle(mix()), count)
    lock = asyncio.Lock()
    outcomes: list[str] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while True:
            async with lock:
                job = next(jobs, None)
            if job is None:
                return
            outcomes.append(await one(client, *job))

    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        await asyncio.gather(*[worker(client) for _ in range(CLIENTS)])
    return outcomes


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def settled(server: ServerProcess) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        stats = server.stats()
        if stats["num_requests_running"] == stats["num_requests_waiting"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


@pytest.mark.real
@pytest.mark.timeout(900)
def test_soak_2000_mixed_requests_leave_nothing_behind(tiny_path: Path, tmp_path: Path) -> None:
    server = ServerProcess(
        ["--model", str(tiny_path), "--decode-concurrency", "8", "--max-queue", "16"], tmp_path / "server.log"
    )
    try:
        began = time.monotonic()
        warm = asyncio.run(traffic(server.url, WARMUP))
        first = settled(server)
        engine_pid = int(first["engine_pid"])
        before = {"server": rss(server.proc.pid), "engine": rss(engine_pid)}
        rest = asyncio.run(traffic(server.url, REQUESTS - WARMUP))
        last = settled(server)
        after = {"server": rss(server.proc.pid), "engine": rss(engine_pid)}
        took = time.monotonic() - began
        bad = [o for o in warm + rest if o != "ok"]
        assert not bad, (len(bad), sorted({b[:60] for b in bad}), [b[-400:] for b in bad[:2]])
        assert last["engine_pid"] == engine_pid and last["restarts"] == 0
        assert last["requests_failed"] == 0
        assert last["num_requests_running"] == last["num_requests_waiting"] == 0
        assert last["kv_cache_usage_perc"] == 0
        assert last["requests_aborted"] >= REQUESTS // len(mix()) - 1  # every abandoned stream was aborted
        growth = {k: after[k] - before[k] for k in after}
        print(f"soak: {REQUESTS} requests in {took:.0f} s; RSS after warm-up {before}, growth {growth}")
        for name, grew in growth.items():
            assert grew <= RSS_TOLERANCE_BYTES, f"{name} RSS grew {grew / 2**20:.1f} MiB"
        assert "Traceback" not in server.log()
    finally:
        server.close()
