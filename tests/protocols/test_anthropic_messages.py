"""POST /v1/messages and /v1/messages/count_tokens: requests to templates, events to Anthropic's
shapes, checked against the anthropic SDK's own types and its client."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import anthropic
import httpx2
import orjson
import pydantic
import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent

from mlx_serve.engine.errors import (
    ContextTooLong,
    EngineFailed,
    EngineUnavailable,
    InvalidRequest,
    QueueFull,
    ServeError,
)
from mlx_serve.engine.types import (
    Event,
    Finished,
    FinishReason,
    ReasoningDelta,
    SamplingParams,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from mlx_serve.protocols import anthropic_messages, structured
from mlx_serve.protocols.contract import (
    Job,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ProtocolContext,
    Result,
    SseEvent,
    ToolCall,
    Unauthorized,
    WireFormat,
)
from mlx_serve.server.writer import encode_frame
from tests.protocols.scripted import (
    ScriptedServer,
    render_json,
    render_stream,
    sse_events,
    text_events,
)

FORMAT: WireFormat = anthropic_messages.FORMAT
USER: Any = {"role": "user", "content": "hi"}
STREAM_EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)
MISSING = object()
WEATHER: Any = {
    "name": "get_weather",
    "description": "Weather now",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TOOL_TURN: list[Event] = [
    ReasoningDelta("The user wants "),
    ReasoningDelta("weather."),
    TextDelta("Let me check."),
    ToolCallStart(0, "call_abc", "get_weather"),
    ToolCallArgsDelta(0, '{"city": '),
    ToolCallArgsDelta(0, '"Paris"}'),
    ToolCallStart(1, "call_def", "get_weather"),
    ToolCallArgsDelta(1, '{"city": "Rome"}'),
    Finished(FinishReason.TOOL_CALLS, Usage(20, 11, cached_tokens=8)),
]


def parse(ctx: ProtocolContext, **fields: Any) -> Job:
    return FORMAT.parse(orjson.dumps({"model": "claude-x", "max_tokens": 64, **fields}), ctx)


def parse_error(ctx: ProtocolContext, **fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse(ctx, **fields)
    assert info.value.status == 400
    return info.value


def rendered(ctx: ProtocolContext) -> Any:
    return ctx.tokenizer.chat_calls[-1]  # type: ignore[attr-defined]


@pytest.fixture
def server(ctx: ProtocolContext) -> ScriptedServer:
    srv = ScriptedServer(FORMAT, ctx, "/v1/messages")
    srv.routes[("POST", "/v1/messages/count_tokens")] = lambda r: anthropic_messages.count_tokens(
        r.content, ctx
    )
    return srv


@pytest.fixture
def client(server: ScriptedServer) -> Iterator[anthropic.Anthropic]:
    http = httpx2.Client(transport=server.transport())
    yield anthropic.Anthropic(
        api_key="k",
        base_url="http://mlx-serve",
        http_client=http,
        max_retries=0,
        _strict_response_validation=True,
    )
    http.close()


# --- parse: the conversation ------------------------------------------------------------------


def test_parse_renders_messages_like_openai_chat(ctx: ProtocolContext) -> None:
    job = parse(ctx, system="be brief", messages=[USER])
    assert rendered(ctx).messages == [{"role": "system", "content": "be brief"}, USER]
    assert job.request.prompt_tokens == tuple(ctx.tokenizer.encode("<system>be brief<user>hi<assistant>"))
    assert job.request.id.startswith("msg_") and len(job.request.id) == 4 + 32
    assert (job.model, job.stream, job.request.max_tokens) == ("claude-x", False, 64)


def test_parse_joins_system_blocks_and_keeps_later_system_turns_in_place(ctx: ProtocolContext) -> None:
    system = [
        {"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "two"},
    ]
    messages = [
        {"role": "system", "content": "zero"},
        USER,
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": [{"type": "text", "text": "three"}]},
        {"role": "system", "content": "four"},
        {"role": "user", "content": "more"},
    ]
    parse(ctx, system=system, messages=messages)
    assert rendered(ctx).messages == [
        {"role": "system", "content": "one\n\ntwo\n\nzero"},
        USER,
        {"role": "assistant", "content": "hello"},
        {"role": "system", "content": "three\n\nfour"},
        {"role": "user", "content": "more"},
    ]


def test_a_later_system_turn_leaves_the_tokens_before_it_unchanged(ctx: ProtocolContext) -> None:
    turns = [USER, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    before = parse(ctx, system="s", messages=turns).request.prompt_tokens
    after = parse(ctx, system="s", messages=[*turns, {"role": "system", "content": "late"}])
    end = len(before) - len("<assistant>")
    assert after.request.prompt_tokens[:end] == before[:end]


def test_with_tools_the_system_prompt_comes_after_them_as_anthropic_orders_them(
    ctx: ProtocolContext, tokenizer: Any
) -> None:
    parse(ctx, system="rules", messages=[USER], tools=[WEATHER])
    assert rendered(ctx).messages == [
        {"role": "system", "content": ""},
        {"role": "system", "content": "rules"},
        USER,
    ]
    tokenizer.system_turns = False  # a template that takes a system message only first
    parse(ctx, system="rules", messages=[USER], tools=[WEATHER])
    assert rendered(ctx).messages == [{"role": "system", "content": "rules"}, USER]


def test_claude_codes_billing_header_stays_out_of_the_prompt(ctx: ProtocolContext) -> None:
    system = [
        {
            "type": "text",
            "text": "x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli; cch=1f2e3;",
        },
        {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
    ]
    parse(ctx, system=system, messages=[USER])
    assert rendered(ctx).messages == [{"role": "system", "content": "You are Claude Code."}, USER]
    parse(replace(ctx, keep_billing_header=True), system=system, messages=[USER])
    assert (
        rendered(ctx).messages[0]["content"].startswith("x-anthropic-billing-header: cc_version=2.1.332.0b8;")
    )


def test_parse_merges_adjacent_turns_and_text_blocks(ctx: ProtocolContext) -> None:
    blocks = [{"type": "text", "text": "a"}, {"type": "text", "text": "b", "citations": None}]
    parse(ctx, messages=[{"role": "user", "content": blocks}, USER])
    assert rendered(ctx).messages == [{"role": "user", "content": "a\n\nb\n\nhi"}]


def test_parse_turns_tool_use_and_results_into_template_tool_turns(ctx: ProtocolContext) -> None:
    messages = [
        USER,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "need weather", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "is_error": True,
                    "content": [{"type": "text", "text": "no such"}, {"type": "text", "text": "city"}],
                },
                {"type": "text", "text": "and tomorrow?"},
            ],
        },
    ]
    parse(ctx, messages=messages, tools=[WEATHER])
    assert rendered(ctx).messages[1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "need weather",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
                {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "Error: no such\n\ncity", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "and tomorrow?"},
    ]


def test_parse_passes_tools_as_openai_functions(ctx: ProtocolContext) -> None:
    bare = {"name": "now", "input_schema": {"type": "object"}, "type": "custom", "strict": True}
    parse(ctx, messages=[USER], tools=[WEATHER, bare], tool_choice={"type": "auto"})
    assert rendered(ctx).tools == [
        {
            "function": {
                "name": "get_weather",
                "description": "Weather now",
                "parameters": WEATHER["input_schema"],
            },
            "type": "function",
        },
        {"function": {"name": "now", "parameters": {"type": "object"}}, "type": "function"},
    ]


def test_parse_tool_choice_none_hides_tools(ctx: ProtocolContext) -> None:
    parse(ctx, messages=[USER], tools=[WEATHER], tool_choice={"type": "none"})
    assert rendered(ctx).tools is None


NOW: Any = {"name": "now", "input_schema": {"type": "object"}}
SCHEMA: Any = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("choice", "name", "required", "parallel"),
    [
        ({"type": "any"}, None, True, True),
        ({"type": "any", "disable_parallel_tool_use": True}, None, True, False),
        ({"type": "tool", "name": "now"}, "now", False, False),
    ],
)
def test_parse_forced_tool_choice_is_a_tool_call_grammar(
    ctx: ProtocolContext, choice: Any, name: str | None, required: bool, parallel: bool
) -> None:
    request = parse(ctx, messages=[USER], tools=[WEATHER, NOW], tool_choice=choice).request
    assert request.forced_tool_calls and request.tools is not None
    assert request.grammar == structured.forced_calls(request.tools, name, required, parallel)


def test_parse_forced_tool_choice_with_output_format_follows_the_tool_with_a_warning(
    ctx: ProtocolContext,
) -> None:
    output = {"format": {"type": "json_schema", "schema": SCHEMA}}
    job = parse(ctx, messages=[USER], tools=[WEATHER], tool_choice={"type": "any"}, output_config=output)
    assert job.request.forced_tool_calls and job.request.tools is not None
    assert job.request.grammar == structured.forced_calls(job.request.tools, None, True, True)
    assert [w for w in job.warnings if "`output_config.format` did not apply" in w]


@pytest.mark.parametrize("field", ["output_config", "output_format"])
def test_parse_output_format_is_the_answers_grammar(ctx: ProtocolContext, field: str) -> None:
    fmt = {"type": "json_schema", "schema": SCHEMA}
    value = {"format": fmt, "effort": "low"} if field == "output_config" else fmt
    request = parse(ctx, messages=[USER], **{field: value}).request
    assert request.grammar == structured.json_schema(SCHEMA, "p")
    assert not request.forced_tool_calls


@pytest.mark.parametrize(
    ("thinking", "kwargs"),
    [
        (None, {"enable_thinking": False, "house": "server"}),
        ({"type": "enabled", "budget_tokens": 2048}, {"enable_thinking": True, "house": "server"}),
        ({"type": "adaptive"}, {"enable_thinking": True, "house": "server"}),
        ({"type": "between_tools"}, {"enable_thinking": True, "house": "server"}),
        ({"type": "disabled"}, {"enable_thinking": False, "house": "server"}),
    ],
)
def test_parse_maps_thinking_to_template_switch(
    ctx: ProtocolContext, thinking: Any, kwargs: dict[str, Any]
) -> None:
    fields = {} if thinking is None else {"thinking": thinking}
    parse(ctx, messages=[USER], **fields)
    assert rendered(ctx).template_kwargs == kwargs


def test_parse_resolves_sampling_and_stop(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=[USER])
    assert job.request.sampling == SamplingParams(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05)
    job = parse(
        ctx, messages=[USER], temperature=0, top_p=0.5, top_k=3, stop_sequences=["END", "\n\n"], stream=True
    )
    assert job.request.sampling == SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.05)
    assert (job.request.stop, job.stream) == (("END", "\n\n"), True)


def test_parse_accepts_every_field_the_sdk_sends(ctx: ProtocolContext) -> None:
    job = parse(
        ctx,
        messages=[USER],
        metadata={"user_id": "u1"},
        service_tier="auto",
        speed="fast",
        inference_geo="us",
        cache_control={"type": "ephemeral"},
        diagnostics={"previous_message_id": None},
        user_profile_id="p",
        workspace_id="w",
        output_config={"effort": "low"},
        container=None,
        stop_sequences=[],
        something_new={"x": 1},
    )
    assert job.request.prompt_tokens


# --- parse: refusals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "text", "param"),
    [
        (
            {"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]},
            "this model has no vision input",
            "messages[0].content[0]",
        ),
        (
            {"role": "user", "content": [{"type": "document", "source": {}}]},
            "this model has no document input",
            "messages[0].content[0]",
        ),
        (
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}
                ],
            },
            "this model has no vision input",
            "messages[0].content[0].content[0]",
        ),
        (
            {"role": "system", "content": [{"type": "image", "source": {}}]},
            "this model has no vision input",
            "messages[0].content[0]",
        ),
        (
            {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            "`tool_use` blocks are not allowed in user content",
            "messages[0].content[0]",
        ),
        (
            {"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": ""}]},
            "`thinking` blocks are not allowed in user content",
            "messages[0].content[0]",
        ),
        (
            {"role": "system", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
            "`tool_result` blocks are not allowed in system content",
            "messages[0].content[0]",
        ),
    ],
)
def test_parse_refuses_blocks_it_cannot_use(
    ctx: ProtocolContext, message: dict[str, Any], text: str, param: str
) -> None:
    err = parse_error(ctx, messages=[message, USER])
    assert (err.message, err.param) == (text, param)


def test_parse_refuses_tool_result_in_assistant_turn(ctx: ProtocolContext) -> None:
    result = {"type": "tool_result", "tool_use_id": "t", "content": "x"}
    err = parse_error(ctx, messages=[USER, {"role": "assistant", "content": [result]}, USER])
    assert err.message == "`tool_result` blocks are not allowed in assistant content"


def test_parse_refuses_prefill(ctx: ProtocolContext) -> None:
    err = parse_error(ctx, messages=[USER, {"role": "assistant", "content": "The answer is"}])
    assert (err.message, err.param) == ("a final assistant message (prefill) is not supported", "messages[1]")


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": "foo"}}}},
            "output_config.format.schema",
            "invalid JSON schema: Invalid type: foo",
        ),
        (
            {
                "output_format": {"type": "json_schema", "schema": {"type": "object"}},
                "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
            },
            "output_format",
            "give `output_config.format` or `output_format`, not both",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "now"}},
            "tool_choice",
            ("`tool_choice` names the function 'now', which is not among the tools offered ('get_weather')"),
        ),
        (
            {"tool_choice": {"type": "any"}},
            "tool_choice",
            "`tool_choice` forces a tool call but no tools are offered",
        ),
        (
            {"container": "cntr_1"},
            "container",
            "`container` (code execution containers) is not supported yet",
        ),
        (
            {"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]},
            "mcp_servers",
            "`mcp_servers` (MCP connectors run by the API) is not supported yet",
        ),
        (
            {"compaction": {"type": "summarize"}},
            "compaction",
            "`compaction` (server-side summarising) is not supported yet",
        ),
        (
            {"thread": {"type": "create"}},
            "thread",
            "`thread` (server-held conversation state) is not supported yet",
        ),
        (
            {"tools": [{"type": "bash_20250124", "name": "bash"}]},
            "tools[0].type",
            (
                "tool type 'bash_20250124' is not supported: only custom tools (name, description, "
                "input_schema) and, left out with a Warning, the server tools Anthropic runs"
            ),
        ),
        (
            {"tools": [{**WEATHER, "allowed_callers": ["code_execution_20250825"]}]},
            "tools[0].allowed_callers",
            "a tool only code execution may call (`allowed_callers` without 'direct') is not supported",
        ),
        ({"tools": [{"name": "f"}]}, "tools[0].input_schema", "a custom tool needs an `input_schema`"),
    ],
)
def test_parse_refuses_what_it_cannot_honour(
    ctx: ProtocolContext, fields: dict[str, Any], param: str, message: str
) -> None:
    err = parse_error(ctx, messages=[USER], **fields)
    assert (err.param, err.message) == (param, message)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": [USER], "max_tokens": MISSING}, "max_tokens"),
        ({"messages": [USER], "max_tokens": 0}, "max_tokens"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": [{"role": "user"}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        ({"messages": [USER], "temperature": 1.5}, "temperature"),
        ({"messages": [USER], "top_p": -0.1}, "top_p"),
        ({"messages": [USER], "top_k": -1}, "top_k"),
        ({"messages": [USER], "stop_sequences": [""]}, "stop_sequences[0]"),
        ({"messages": [USER], "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
        ({"messages": [USER], "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"messages": [USER], "model": MISSING}, "model"),
        ({"messages": [USER], "model": 3}, "model"),
    ],
)
def test_parse_rejects_malformed_requests(ctx: ProtocolContext, fields: dict[str, Any], param: str) -> None:
    body = {"model": "claude-x", "max_tokens": 64, **fields}
    body = {k: v for k, v in body.items() if v is not MISSING}
    with pytest.raises(InvalidRequest) as info:
        FORMAT.parse(orjson.dumps(body), ctx)
    assert info.value.param == param


def test_parse_reports_template_errors_as_400(ctx: ProtocolContext) -> None:
    ctx.tokenizer.template_error = "chat template failed: roles must alternate"  # type: ignore[attr-defined]
    err = parse_error(ctx, messages=[USER])
    assert (err.message, err.param) == ("chat template failed: roles must alternate", "messages")


# --- count_tokens -----------------------------------------------------------------------------


def test_count_tokens_equals_the_prompt_a_message_would_use(ctx: ProtocolContext) -> None:
    fields = {"model": "claude-x", "system": "s", "messages": [USER], "tools": [WEATHER]}
    status, body = anthropic_messages.count_tokens(orjson.dumps(fields), ctx)
    job = parse(ctx, **fields)
    assert status == 200
    assert MessageTokensCount.model_validate(orjson.loads(body)).input_tokens == len(
        job.request.prompt_tokens
    )


def test_count_tokens_errors_use_anthropic_envelope(ctx: ProtocolContext) -> None:
    fields = {"model": "m", "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}
    status, body = anthropic_messages.count_tokens(orjson.dumps(fields), ctx)
    assert (status, orjson.loads(body)) == (
        400,
        {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "this model has no vision input"},
        },
    )


# --- JSON answers -----------------------------------------------------------------------------


def result_json(ctx: ProtocolContext, result: Result, **fields: Any) -> dict[str, Any]:
    job = parse(ctx, messages=[USER], **fields)
    body: dict[str, Any] = orjson.loads(FORMAT.to_json(job, [result], ctx))
    Message.model_validate(body)
    return body


def test_to_json_matches_anthropic_shape(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=[USER])
    result = Result("Hello!", FinishReason.STOP, Usage(12, 3, cached_tokens=8))
    body = orjson.loads(FORMAT.to_json(job, [result], ctx))
    assert body == {
        "id": job.request.id,
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [{"type": "text", "text": "Hello!"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 4,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 8,
            "output_tokens": 3,
        },
    }
    sdk = Message.model_validate(body)
    assert sdk.usage.input_tokens + (sdk.usage.cache_read_input_tokens or 0) == 12


@pytest.mark.parametrize(
    ("reason", "stop_sequence", "stop_reason"),
    [
        (FinishReason.STOP, None, "end_turn"),
        (FinishReason.STOP, "END", "stop_sequence"),
        (FinishReason.LENGTH, None, "max_tokens"),
        (FinishReason.TOOL_CALLS, None, "tool_use"),
    ],
)
def test_to_json_maps_finish_reasons(
    ctx: ProtocolContext, reason: FinishReason, stop_sequence: str | None, stop_reason: str
) -> None:
    body = result_json(ctx, Result("x", reason, Usage(3, 1), stop_sequence=stop_sequence))
    assert (body["stop_reason"], body["stop_sequence"]) == (stop_reason, stop_sequence)


def test_to_json_orders_thinking_text_and_tool_use(ctx: ProtocolContext) -> None:
    calls = (ToolCall("call_1", "get_weather", '{"city": "Paris"}'), ToolCall("toolu_2", "f", ""))
    body = result_json(
        ctx, Result("Checking.", FinishReason.TOOL_CALLS, Usage(5, 9), reasoning="hmm", tool_calls=calls)
    )
    assert body["content"] == [
        {"type": "thinking", "thinking": "hmm", "signature": ""},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_2", "name": "f", "input": {}},
    ]
    assert body["stop_reason"] == "tool_use"


def test_to_json_empty_answer_has_no_blocks(ctx: ProtocolContext) -> None:
    assert result_json(ctx, Result("", FinishReason.STOP, Usage(3, 1)))["content"] == []


def test_to_json_hides_omitted_thinking(ctx: ProtocolContext) -> None:
    body = result_json(
        ctx,
        Result("ok", FinishReason.STOP, Usage(3, 4), reasoning="secret"),
        thinking={"type": "enabled", "budget_tokens": 1024, "display": "omitted"},
    )
    assert body["content"][0] == {"type": "thinking", "thinking": "", "signature": ""}


def test_to_json_refuses_tool_arguments_that_are_not_an_object(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=[USER])
    result = Result("", FinishReason.TOOL_CALLS, Usage(3, 4), tool_calls=(ToolCall("call_1", "f", "[1, 2]"),))
    with pytest.raises(EngineFailed):
        FORMAT.to_json(job, [result], ctx)


def test_to_json_a_call_cut_short_keeps_the_members_it_finished(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=[USER])
    calls = (ToolCall("call_1", "get_weather", '{"city": "Paris", "da'), ToolCall("call_2", "f", '{"q'))
    body = orjson.loads(
        FORMAT.to_json(job, [Result("", FinishReason.LENGTH, Usage(3, 4), tool_calls=calls)], ctx)
    )
    assert [b["input"] for b in body["content"]] == [{"city": "Paris"}, {}]
    assert body["stop_reason"] == "max_tokens"


# --- streaming --------------------------------------------------------------------------------


def stream_of(
    ctx: ProtocolContext, events: list[Event], fail: ServeError | None = None, **fields: Any
) -> list[tuple[str | None, Any]]:
    job = parse(ctx, messages=[USER], stream=True, **fields)
    frames = sse_events(render_stream(FORMAT, job, ctx, events, fail))
    for name, data in frames:
        assert name == data["type"]
        if name not in ("ping", "error"):
            STREAM_EVENT.validate_python(data)
    return frames


def test_stream_text_follows_the_event_grammar(ctx: ProtocolContext) -> None:
    frames = stream_of(ctx, text_events("Hel", "", "lo", usage=Usage(9, 2, cached_tokens=4)))
    start = frames[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["stop_sequence"]) == ([], None, None)
    assert frames[1:] == [
        ("ping", {"type": "ping"}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {
                    "input_tokens": 5,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 4,
                    "output_tokens": 2,
                },
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def test_stream_message_start_counts_the_prompt(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=[USER], stream=True)
    message = sse_events(render_stream(FORMAT, job, ctx, text_events("a")))[0][1]["message"]
    assert message["usage"] == {
        "input_tokens": len(job.request.prompt_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    }
    assert (message["id"], message["model"], message["role"]) == (job.request.id, "claude-x", "assistant")


def test_stream_opens_one_block_per_part(ctx: ProtocolContext) -> None:
    frames = stream_of(ctx, TOOL_TURN)
    blocks = [(d["index"], d["content_block"]) for n, d in frames if n == "content_block_start"]
    assert blocks == [
        (0, {"type": "thinking", "thinking": "", "signature": ""}),
        (1, {"type": "text", "text": ""}),
        (2, {"type": "tool_use", "id": "toolu_abc", "name": "get_weather", "input": {}}),
        (3, {"type": "tool_use", "id": "toolu_def", "name": "get_weather", "input": {}}),
    ]
    deltas = [(d["index"], d["delta"]) for n, d in frames if n == "content_block_delta"]
    assert deltas == [
        (0, {"type": "thinking_delta", "thinking": "The user wants "}),
        (0, {"type": "thinking_delta", "thinking": "weather."}),
        (1, {"type": "text_delta", "text": "Let me check."}),
        (2, {"type": "input_json_delta", "partial_json": '{"city": '}),
        (2, {"type": "input_json_delta", "partial_json": '"Paris"}'}),
        (3, {"type": "input_json_delta", "partial_json": '{"city": "Rome"}'}),
    ]
    names = [n for n, _ in frames]
    assert names.count("content_block_start") == names.count("content_block_stop") == 4
    assert frames[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_stream_omitted_thinking_keeps_block_without_text(ctx: ProtocolContext) -> None:
    frames = stream_of(ctx, TOOL_TURN, thinking={"type": "adaptive", "display": "omitted"})
    assert frames[2][1]["content_block"]["type"] == "thinking"
    assert all(d["delta"]["type"] != "thinking_delta" for n, d in frames if n == "content_block_delta")


def test_stream_stop_sequence_in_message_delta(ctx: ProtocolContext) -> None:
    events: list[Event] = [TextDelta("a"), Finished(FinishReason.STOP, Usage(3, 2), "END")]
    delta = stream_of(ctx, events)[-2][1]["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_stream_error_is_an_error_event_in_anthropic_envelope(ctx: ProtocolContext) -> None:
    frames = stream_of(ctx, [TextDelta("a")], fail=EngineFailed("engine crashed"))
    assert frames[-1] == (
        "error",
        {"type": "error", "error": {"type": "api_error", "message": "engine crashed"}},
    )


def test_stream_heartbeat_is_a_ping_event(ctx: ProtocolContext) -> None:
    renderer = FORMAT.renderer(parse(ctx, messages=[USER], stream=True), ctx)
    assert renderer.heartbeat() == SseEvent({"type": "ping"}, "ping")
    assert encode_frame(renderer.heartbeat()) == b'event: ping\ndata: {"type":"ping"}\n\n'


def test_stream_skips_empty_deltas(ctx: ProtocolContext) -> None:
    renderer = FORMAT.renderer(parse(ctx, messages=[USER], stream=True), ctx)
    for ev in (TextDelta(""), ReasoningDelta(""), ToolCallArgsDelta(0, "x")):
        assert renderer.delta(ev) == []


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (InvalidRequest("bad"), "invalid_request_error"),
        (ContextTooLong("long"), "invalid_request_error"),
        (Unauthorized("key"), "authentication_error"),
        (NotFound("nope"), "not_found_error"),
        (MethodNotAllowed("GET"), "invalid_request_error"),
        (PayloadTooLarge("big"), "request_too_large"),
        (QueueFull("busy"), "rate_limit_error"),
        (EngineFailed("oom"), "api_error"),
        (EngineUnavailable("loading"), "overloaded_error"),
        (ServeError("?"), "api_error"),
    ],
)
def test_error_body_maps_status_to_anthropic_type(exc: ServeError, kind: str) -> None:
    body = orjson.loads(FORMAT.error_body(exc))
    assert body == {"type": "error", "error": {"type": kind, "message": exc.message}}


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, anthropic.BadRequestError),
        (401, anthropic.AuthenticationError),
        (404, anthropic.NotFoundError),
        (413, anthropic.APIStatusError),
        (429, anthropic.RateLimitError),
        (500, anthropic.InternalServerError),
        (503, anthropic.InternalServerError),
    ],
)
def test_sdk_raises_its_error_class_for_each_status(
    ctx: ProtocolContext, status: int, error_class: type[Exception]
) -> None:
    exc = {
        400: InvalidRequest,
        401: Unauthorized,
        404: NotFound,
        413: PayloadTooLarge,
        429: QueueFull,
        500: EngineFailed,
        503: EngineUnavailable,
    }[status]("why")
    http = httpx2.Client(
        transport=httpx2.MockTransport(lambda r: httpx2.Response(exc.status, content=FORMAT.error_body(exc)))
    )
    client = anthropic.Anthropic(api_key="k", base_url="http://x", http_client=http, max_retries=0)
    with pytest.raises(error_class) as info:
        client.messages.create(model="m", max_tokens=5, messages=[USER])
    assert info.value.body == orjson.loads(FORMAT.error_body(exc))  # type: ignore[attr-defined]


# --- the SDK as client ------------------------------------------------------------------------


def test_sdk_create_and_stream_agree(client: anthropic.Anthropic, server: ScriptedServer) -> None:
    server.events = TOOL_TURN
    whole = client.messages.create(model="claude-x", max_tokens=64, messages=[USER], tools=[WEATHER])
    with client.messages.stream(model="claude-x", max_tokens=64, messages=[USER], tools=[WEATHER]) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert texts == ["Let me check."]
    assert final.model_dump(exclude={"id"}) == whole.model_dump(exclude={"id"})
    assert [b.type for b in whole.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert whole.stop_reason == "tool_use"
    assert whole.usage.input_tokens == 12 and whole.usage.cache_read_input_tokens == 8


def test_sdk_raw_stream_events_validate(client: anthropic.Anthropic, server: ScriptedServer) -> None:
    server.events = text_events("Hi", " there")
    events = list(client.messages.create(model="m", max_tokens=8, messages=[USER], stream=True))
    assert [e.type for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_sdk_stream_raises_on_error_event(client: anthropic.Anthropic, server: ScriptedServer) -> None:
    server.events, server.fail = [TextDelta("par")], QueueFull("engine queue is full")
    with (
        pytest.raises(anthropic.APIStatusError) as info,
        client.messages.stream(model="m", max_tokens=8, messages=[USER]) as stream,
    ):
        stream.get_final_message()
    assert info.value.body == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "engine queue is full"},
    }


def test_sdk_multi_turn_with_tool_round_trip(
    client: anthropic.Anthropic, server: ScriptedServer, ctx: ProtocolContext
) -> None:
    server.events = TOOL_TURN
    first = client.messages.create(model="m", max_tokens=64, messages=[USER], tools=[WEATHER])
    results: Any = [
        {"type": "tool_result", "tool_use_id": b.id, "content": "sunny"}
        for b in first.content
        if b.type == "tool_use"
    ]
    server.events = text_events("Sunny in both.")
    second = client.messages.create(
        model="m",
        max_tokens=64,
        tools=[WEATHER],
        messages=[
            USER,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": results},
        ],
    )
    assert second.content[0].type == "text" and second.stop_reason == "end_turn"
    history = rendered(ctx).messages
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "tool"]
    assert history[1]["reasoning_content"] == "The user wants weather."
    assert [c["id"] for c in history[1]["tool_calls"]] == ["toolu_abc", "toolu_def"]


def test_sdk_count_tokens(client: anthropic.Anthropic, ctx: ProtocolContext) -> None:
    count = client.messages.count_tokens(model="m", messages=[USER], system="s")
    assert count.input_tokens == len(ctx.tokenizer.encode("<system>s<user>hi<assistant>"))


def test_sdk_bad_request_is_bad_request_error(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(
            model="m",
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": "http://x/cat.png"}}],
                }
            ],
        )
    assert info.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "this model has no vision input"},
    }


def test_json_usage_splits_cache_reads_from_input(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=[USER])
    whole = orjson.loads(render_json(FORMAT, job, ctx, TOOL_TURN))
    assert whole["usage"] == {
        "input_tokens": 12,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 8,
        "output_tokens": 11,
    }
