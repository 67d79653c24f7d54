"""Send one streaming request of any wire format and time it: TTFT and the cached tokens its
server reports (OpenAI `cached_tokens`, Anthropic `cache_read_input_tokens`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from bench.agent_sessions import AgentRequest

CACHED_KEYS = ("cached_tokens", "cache_read_input_tokens")
PROMPT_KEYS = ("prompt_tokens", "input_tokens")
TEXT_KEYS = ("content", "text", "reasoning_content", "reasoning", "partial_json", "arguments", "thinking")


@dataclass(slots=True)
class TurnResult:
    """What one request did; times in seconds."""

    ttft_s: float | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None


def find_key(value: Any, keys: tuple[str, ...]) -> int | None:
    """The first integer under any of `keys`, anywhere in a decoded JSON event."""
    if isinstance(value, dict):
        for key in keys:
            if isinstance(value.get(key), int):
                return int(value[key])
        found = (find_key(v, keys) for v in value.values())
    elif isinstance(value, list):
        found = (find_key(v, keys) for v in value)
    else:
        return None
    return next((f for f in found if f is not None), None)


def carries_text(event: Any) -> bool:
    """Whether a stream event holds generated text (a delta with a non-empty text field)."""
    if isinstance(event, dict):
        delta = event.get("delta")
        if isinstance(delta, str):
            return bool(delta)
        if isinstance(delta, dict) and any(isinstance(delta.get(k), str) and delta[k] for k in TEXT_KEYS):
            return True
        return any(carries_text(v) for k, v in event.items() if k in ("choices", "delta"))
    if isinstance(event, list):
        return any(carries_text(v) for v in event)
    return False


def fold(result: TurnResult, event: Any, elapsed: float) -> None:
    if isinstance(event, dict) and "error" in event and event.get("type") != "message_start":
        result.error = f"in-band error: {str(event['error'])[:200]}"
    if result.ttft_s is None and carries_text(event):
        result.ttft_s = elapsed
    # the last report wins: Anthropic's message_start and OpenAI's final usage chunk
    cached, prompt = find_key(event, CACHED_KEYS), find_key(event, PROMPT_KEYS)
    result.cached_tokens = cached if cached is not None else result.cached_tokens
    result.prompt_tokens = prompt if prompt is not None else result.prompt_tokens


async def send(client: httpx.AsyncClient, request: AgentRequest) -> TurnResult:
    result, began = TurnResult(), time.perf_counter()
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    try:
        async with client.stream(
            "POST", request.route, content=orjson.dumps(request.body), headers=headers
        ) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                return TurnResult(error=f"HTTP {r.status_code}: {text[:200]}")
            async for line in r.aiter_lines():
                data = line[5:].strip() if line.startswith("data:") else ""
                if data and data != "[DONE]":
                    fold(result, orjson.loads(data), time.perf_counter() - began)
    except httpx.HTTPError as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:300]
    return result
