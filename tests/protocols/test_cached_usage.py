"""A finished request's cached prompt tokens reach the client on every wire format, whole and
streamed, under the field each SDK reads: OpenAI chat and completions
`usage.prompt_tokens_details.cached_tokens`, Anthropic `usage.cache_read_input_tokens` (with
`input_tokens` the uncached rest) and Responses `usage.input_tokens_details.cached_tokens`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import anthropic.types
import httpx2
import openai.types
import openai.types.chat
import openai.types.responses
import orjson
import pytest

from mlx_serve.engine.errors import EngineFailed
from mlx_serve.engine.types import Admitted, Usage
from mlx_serve.protocols import anthropic_messages, openai_chat, openai_completions
from mlx_serve.protocols.contract import ProtocolContext, WireFormat
from mlx_serve.protocols.openai_responses import OpenAIResponses
from mlx_serve.protocols.responses_store import ResponsesStore
from tests.protocols.scripted import ScriptedServer, render_json, render_stream, sse_events, text_events

PROMPT, CACHED = 12, 8
USAGE = Usage(PROMPT, 2, cached_tokens=CACHED)


def _chat(body: dict[str, Any]) -> int | None:
    details = openai.types.chat.ChatCompletion.model_validate(body).usage.prompt_tokens_details  # type: ignore[union-attr]
    return details.cached_tokens if details else None


def _completion(body: dict[str, Any]) -> int | None:
    details = openai.types.Completion.model_validate(body).usage.prompt_tokens_details  # type: ignore[union-attr]
    return details.cached_tokens if details else None


def _message(body: dict[str, Any]) -> int | None:
    usage = anthropic.types.Message.model_validate(body).usage
    assert usage.input_tokens == PROMPT - CACHED
    return usage.cache_read_input_tokens


def _response(body: dict[str, Any]) -> int | None:
    usage = openai.types.responses.Response.model_validate(body).usage
    assert usage is not None
    return usage.input_tokens_details.cached_tokens


def _chunk_usage(frames: list[tuple[str | None, Any]]) -> dict[str, Any]:
    [usage] = [f["usage"] for _, f in frames if isinstance(f, dict) and f.get("usage")]
    return dict(usage)


# (format, request fields, the SDK's reading of a whole body, of the stream's frames)
CASES: dict[
    str, tuple[Callable[[], WireFormat], dict[str, Any], Callable[..., int | None], Callable[..., int]]
] = {
    "chat": (
        lambda: openai_chat.FORMAT,
        {"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}},
        _chat,
        lambda frames: _chunk_usage(frames)["prompt_tokens_details"]["cached_tokens"],
    ),
    "completions": (
        lambda: openai_completions.FORMAT,
        {"prompt": "hi", "stream_options": {"include_usage": True}},
        _completion,
        lambda frames: _chunk_usage(frames)["prompt_tokens_details"]["cached_tokens"],
    ),
    "messages": (
        lambda: anthropic_messages.FORMAT,
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        _message,
        lambda frames: next(f for n, f in frames if n == "message_delta")["usage"]["cache_read_input_tokens"],
    ),
    "responses": (
        lambda: OpenAIResponses(ResponsesStore(ttl_s=60, max_bytes=1 << 20)),
        {"input": "hi"},
        _response,
        lambda frames: next(f for n, f in frames if n == "response.completed")["response"]["usage"][
            "input_tokens_details"
        ]["cached_tokens"],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_a_finished_requests_cached_tokens_are_in_its_usage(name: str, ctx: ProtocolContext) -> None:
    make, fields, whole, streamed = CASES[name]
    fmt = make()
    job = fmt.parse(orjson.dumps({"model": "m", **fields}), ctx)
    body = orjson.loads(render_json(fmt, job, ctx, text_events("a", "b", usage=USAGE)))
    assert whole(body) == CACHED
    job = fmt.parse(orjson.dumps({"model": "m", "stream": True, **fields}), ctx)
    frames = sse_events(render_stream(fmt, job, ctx, text_events("a", "b", usage=USAGE)))
    assert streamed(frames) == CACHED


def _anthropic(server: ScriptedServer) -> anthropic.Anthropic:
    http = httpx2.Client(transport=server.transport())
    return anthropic.Anthropic(
        api_key="k",
        base_url="http://mlx-serve",
        http_client=http,
        max_retries=0,
        _strict_response_validation=True,
    )


def test_anthropic_message_start_reports_what_the_cache_served(ctx: ProtocolContext) -> None:
    # Claude Code takes a turn's usage from message_start: the cache read must be there already.
    server = ScriptedServer(anthropic_messages.FORMAT, ctx, "/v1/messages", admitted=Admitted(CACHED))
    server.events = text_events("a", "b", usage=USAGE)
    with _anthropic(server).messages.stream(
        model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = next(e for e in events if e.type == "message_start")
    prompt = len(server.jobs[0].request.prompt_tokens)
    assert start.message.usage.cache_read_input_tokens == CACHED
    assert start.message.usage.input_tokens == prompt - CACHED
    assert final.usage.cache_read_input_tokens == CACHED  # the finish says the same


def test_anthropic_message_start_without_an_admission_reports_no_cache_read(ctx: ProtocolContext) -> None:
    # The request failed before its row began: message_start, whole prompt uncached, then the error.
    server = ScriptedServer(anthropic_messages.FORMAT, ctx, "/v1/messages", events=[])
    server.fail = EngineFailed("the engine stopped")
    client, seen = _anthropic(server), []
    with (
        pytest.raises(anthropic.APIStatusError, match="the engine stopped"),
        client.messages.stream(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        ) as stream,
    ):
        seen.extend(stream)
    [start] = seen
    assert start.type == "message_start"
    assert start.message.usage.cache_read_input_tokens == 0
    assert start.message.usage.input_tokens == len(server.jobs[0].request.prompt_tokens)
