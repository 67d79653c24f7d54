"""Anthropic message threads: `thread: create` keeps the conversation under the reply's id,
`continue` sends only the new turn; refusals carry the error codes the SDK acts on."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from mlx_serve.engine.errors import ServeError
from mlx_serve.engine.types import Finished, FinishReason, ToolCallArgsDelta, ToolCallStart, Usage
from mlx_serve.protocols.anthropic_messages import AnthropicMessages
from mlx_serve.protocols.anthropic_stream import error_json
from mlx_serve.protocols.anthropic_threads import ThreadStore
from mlx_serve.protocols.contract import Job, ProtocolContext
from mlx_serve.protocols.responses_store import ResponsesStore
from tests.protocols.scripted import render_json, render_stream, text_events

BASH: Any = {
    "name": "Bash",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
USER: Any = {"role": "user", "content": "hi"}


@pytest.fixture
def fmt() -> AnthropicMessages:
    return AnthropicMessages(ThreadStore())


def turn(fmt: AnthropicMessages, ctx: ProtocolContext, **fields: Any) -> Job:
    return fmt.parse(orjson.dumps({"model": "m", "max_tokens": 16, **fields}), ctx)


def sent(ctx: ProtocolContext) -> list[dict[str, Any]]:
    return ctx.tokenizer.chat_calls[-1].messages  # type: ignore[attr-defined,no-any-return]


def continued(previous: str, **fields: Any) -> dict[str, Any]:
    return {"thread": {"type": "continue", "previous_message_id": previous}, **fields}


def refusal(fmt: AnthropicMessages, ctx: ProtocolContext, **fields: Any) -> tuple[int, dict[str, Any]]:
    with pytest.raises(ServeError) as info:
        turn(fmt, ctx, **fields)
    return info.value.status, error_json(info.value)["error"]


def test_a_thread_continues_from_the_reply_with_only_the_new_messages(
    fmt: AnthropicMessages, ctx: ProtocolContext
) -> None:
    first = turn(fmt, ctx, system="rules", tools=[BASH], messages=[USER], thread={"type": "create"})
    reply = orjson.loads(render_json(fmt, first, ctx, text_events("Hello", "!")))
    assert reply["id"] == first.request.id and reply["content"] == [{"type": "text", "text": "Hello!"}]
    second = turn(fmt, ctx, messages=[{"role": "user", "content": "again"}], **continued(reply["id"]))
    assert sent(ctx)[1:] == [
        {"role": "system", "content": "rules"},
        USER,
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "again"},
    ]
    assert second.request.tools is not None and second.request.tools[0]["function"]["name"] == "Bash"
    # The same conversation sent whole renders the same prompt: the prefix cache sees one thread.
    whole = [USER, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "again"}]
    alone = turn(fmt, ctx, system="rules", tools=[BASH], messages=whole)
    assert alone.request.prompt_tokens == second.request.prompt_tokens


def test_a_streamed_tool_call_is_kept_with_its_input(fmt: AnthropicMessages, ctx: ProtocolContext) -> None:
    first = turn(fmt, ctx, tools=[BASH], messages=[USER], thread={"type": "create"}, stream=True)
    events = [
        ToolCallStart(0, "call_1", "Bash"),
        ToolCallArgsDelta(0, '{"command": '),
        ToolCallArgsDelta(0, '"ls"}'),
        Finished(FinishReason.TOOL_CALLS, Usage(5, 4)),
    ]
    render_stream(fmt, first, ctx, events)
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"}
    turn(fmt, ctx, messages=[{"role": "user", "content": [result]}], **continued(first.request.id))
    call = sent(ctx)[-2]["tool_calls"][0]
    assert call["id"] == "toolu_1" and call["function"] == {"name": "Bash", "arguments": {"command": "ls"}}
    assert sent(ctx)[-1] == {"role": "tool", "content": "a.txt", "tool_call_id": "toolu_1"}


def test_a_reply_is_continued_once(fmt: AnthropicMessages, ctx: ProtocolContext) -> None:
    first = turn(fmt, ctx, messages=[USER], thread={"type": "create"})
    render_json(fmt, first, ctx, text_events("a"))
    second = turn(fmt, ctx, messages=[USER], **continued(first.request.id))
    render_json(fmt, second, ctx, text_events("b"))
    status, error = refusal(fmt, ctx, messages=[USER], **continued(first.request.id))
    assert (status, error["type"], error["details"]) == (
        400,
        "invalid_request_error",
        {"error_code": "thread_already_continued"},
    )
    turn(fmt, ctx, messages=[USER], **continued(second.request.id))  # the latest reply continues


def test_an_unknown_or_another_keys_thread_is_not_found(fmt: AnthropicMessages, ctx: ProtocolContext) -> None:
    first = turn(fmt, ctx, messages=[USER], thread={"type": "create"})
    render_json(fmt, first, ctx, text_events("a"))
    for who, previous in (("", "msg_nope"), ("other-key", first.request.id)):
        with pytest.raises(ServeError) as info:
            turn(fmt, replace(ctx, principal=who), messages=[USER], **continued(previous))
        error = error_json(info.value)["error"]
        assert info.value.status == 404 and info.value.param == "thread.previous_message_id"
        assert (error["type"], error["details"]) == ("not_found_error", {"error_code": "thread_not_found"})


def test_a_thread_expires_with_the_stores_time_to_live(ctx: ProtocolContext) -> None:
    now = [0.0]
    fmt = AnthropicMessages(ThreadStore(ResponsesStore(ttl_s=60, clock=lambda: now[0])))
    first = turn(fmt, ctx, messages=[USER], thread={"type": "create"})
    render_json(fmt, first, ctx, text_events("a"))
    now[0] = 61.0
    assert refusal(fmt, ctx, messages=[USER], **continued(first.request.id))[0] == 404


def test_continuing_refuses_the_create_only_fields(fmt: AnthropicMessages, ctx: ProtocolContext) -> None:
    first = turn(fmt, ctx, messages=[USER], thread={"type": "create"})
    render_json(fmt, first, ctx, text_events("a"))
    for field, value in (("system", "new rules"), ("tools", [BASH])):
        with pytest.raises(ServeError) as info:
            turn(fmt, ctx, messages=[USER], **{field: value}, **continued(first.request.id))
        assert info.value.status == 400 and info.value.param == field


def test_a_bad_thread_shape_is_refused_by_its_path(fmt: AnthropicMessages, ctx: ProtocolContext) -> None:
    with pytest.raises(ServeError) as info:
        turn(fmt, ctx, messages=[USER], thread={"type": "fork"})
    assert info.value.status == 400 and "thread" in (info.value.param or info.value.message)
    with pytest.raises(ServeError) as info:
        turn(fmt, ctx, messages=[], thread={"type": "create"})
    assert info.value.param == "messages"


def test_count_tokens_counts_the_threads_conversation(fmt: AnthropicMessages, ctx: ProtocolContext) -> None:
    first = turn(fmt, ctx, system="rules", messages=[USER], thread={"type": "create"})
    render_json(fmt, first, ctx, text_events("Hello"))
    body = {"model": "m", "messages": [{"role": "user", "content": "again"}], **continued(first.request.id)}
    status, out = fmt.count_tokens(orjson.dumps(body), ctx)
    whole = [USER, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "again"}]
    _, alone = fmt.count_tokens(orjson.dumps({"model": "m", "system": "rules", "messages": whole}), ctx)
    assert status == 200 and orjson.loads(out) == orjson.loads(alone)
