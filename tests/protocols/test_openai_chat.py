"""POST /v1/chat/completions: messages to template, results and events to OpenAI's shapes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import openai
import orjson
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from mlx_serve.engine.errors import EngineFailed, InvalidRequest
from mlx_serve.engine.types import Finished, FinishReason, TextDelta, TokenLogprob, Usage
from mlx_serve.protocols import openai_chat, structured
from mlx_serve.protocols.contract import KEEP_ALIVE, Frames, Job, ProtocolContext, Result, WireFormat
from mlx_serve.protocols.openai_render import DONE

FORMAT: WireFormat = openai_chat.FORMAT
USER = {"role": "user", "content": "hi"}
Split = Callable[[Frames], list[Any]]


def parse(ctx: ProtocolContext, **fields: Any) -> Job:
    return FORMAT.parse(orjson.dumps({"model": "m", **fields}), ctx)


def parse_error(ctx: ProtocolContext, **fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse(ctx, **fields)
    assert info.value.status == 400
    return info.value


def rendered_messages(ctx: ProtocolContext) -> list[dict[str, Any]]:
    return ctx.tokenizer.chat_calls[-1].messages  # type: ignore[attr-defined,no-any-return]


# --- parse ------------------------------------------------------------------------------------


def test_parse_renders_messages_through_template(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=[{"role": "system", "content": "be brief"}, USER])
    assert rendered_messages(ctx) == [{"role": "system", "content": "be brief"}, USER]
    assert job.request.prompt_tokens == tuple(ctx.tokenizer.encode("<system>be brief<user>hi<assistant>"))
    assert job.request.id.startswith("chatcmpl-")


def test_parse_flattens_text_parts_like_mlx_lm(ctx: ProtocolContext) -> None:
    parts = [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}]
    parse(ctx, messages=[{"role": "user", "content": parts}])
    assert rendered_messages(ctx) == [{"role": "user", "content": "one two"}]


def test_parse_turns_null_content_into_empty_text(ctx: ProtocolContext) -> None:
    parse(ctx, messages=[USER, {"role": "assistant", "content": None}, USER])
    assert rendered_messages(ctx)[1] == {"role": "assistant", "content": ""}


def test_parse_maps_developer_role_to_system(ctx: ProtocolContext) -> None:
    parse(ctx, messages=[{"role": "developer", "content": "rules"}, USER])
    assert rendered_messages(ctx)[0] == {"role": "system", "content": "rules"}


def test_parse_keeps_tool_turns_for_template(ctx: ProtocolContext) -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
    }
    messages = [
        USER,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "content": "ok", "reasoning_content": "thought", "name": "bot"},
    ]
    parse(ctx, messages=messages)
    assert rendered_messages(ctx)[1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "ok", "name": "bot", "reasoning_content": "thought"},
    ]


@pytest.mark.parametrize(("arguments", "expected"), [({"a": 1}, {"a": 1}), ("", {}), ("[1]", [1])])
def test_parse_accepts_tool_call_arguments_forms(ctx: ProtocolContext, arguments: Any, expected: Any) -> None:
    call = {"function": {"name": "f", "arguments": arguments}}
    parse(ctx, messages=[USER, {"role": "assistant", "tool_calls": [call]}])
    assert rendered_messages(ctx)[1]["tool_calls"] == [
        {"type": "function", "function": {"name": "f", "arguments": expected}}
    ]


def test_parse_rejects_tool_call_arguments_that_are_not_json(ctx: ProtocolContext) -> None:
    call = {"function": {"name": "f", "arguments": "{oops"}}
    err = parse_error(ctx, messages=[USER, {"role": "assistant", "tool_calls": [call]}])
    assert err.param == "messages[1].tool_calls[0].function.arguments"


def test_parse_passes_tools_and_template_kwargs(ctx: ProtocolContext) -> None:
    tool = {
        "type": "function",
        "function": {"name": "weather", "description": "Weather now", "parameters": {"type": "object"}},
    }
    parse(
        ctx,
        messages=[USER],
        tools=[tool],
        tool_choice="auto",
        chat_template_kwargs={"enable_thinking": True, "extra": 1},
    )
    call = ctx.tokenizer.chat_calls[-1]  # type: ignore[attr-defined]
    assert call.tools == [{"function": tool["function"], "type": "function"}]
    assert call.template_kwargs == {"enable_thinking": True, "house": "server", "extra": 1}


def test_parse_omits_absent_tool_fields_and_empty_tools(ctx: ProtocolContext) -> None:
    parse(ctx, messages=[USER], tools=[{"type": "function", "function": {"name": "f"}}])
    assert ctx.tokenizer.chat_calls[-1].tools == [  # type: ignore[attr-defined]
        {"function": {"name": "f"}, "type": "function"}
    ]
    parse(ctx, messages=[USER], tools=[])
    assert ctx.tokenizer.chat_calls[-1].tools is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("part", "kind"),
    [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}, "vision"),
        ({"type": "input_image", "image_url": "http://x/y.png"}, "vision"),
        ({"type": "image", "image": "http://x/y.png"}, "vision"),
        ({"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}, "audio"),
        ({"type": "file", "file": {"file_id": "f"}}, "file"),
    ],
)
def test_parse_rejects_media_parts(ctx: ProtocolContext, part: dict[str, Any], kind: str) -> None:
    content = [{"type": "text", "text": "look"}, part]
    err = parse_error(ctx, messages=[USER, {"role": "user", "content": content}])
    assert (err.message, err.param) == (f"this model has no {kind} input", "messages[1].content[1]")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": None}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"content": "hi"}]}, "messages[0].role"),
        ({"messages": [USER, {"role": "robot", "content": "hi"}]}, "messages[1].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "video"}]}]}, "messages[0].content[0].type"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
        ({"messages": [{"role": "user", "content": ["hi"]}]}, "messages[0].content[0]"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
            "messages[0].tool_calls[0].function.name",
        ),
        ({"messages": [USER], "tools": [{"type": "function"}]}, "tools[0].function"),
        ({"messages": [USER], "tools": [{"type": "custom", "function": {"name": "f"}}]}, "tools[0].type"),
        ({"messages": [USER], "chat_template_kwargs": []}, "chat_template_kwargs"),
    ],
)
def test_parse_rejects_malformed_messages(ctx: ProtocolContext, fields: dict[str, Any], param: str) -> None:
    assert parse_error(ctx, **fields).param == param


def test_parse_reports_template_errors_as_400(ctx: ProtocolContext) -> None:
    ctx.tokenizer.template_error = "chat template failed: roles must alternate"  # type: ignore[attr-defined]
    err = parse_error(ctx, messages=[USER, USER])
    assert (err.message, err.param) == ("chat template failed: roles must alternate", "messages")


@pytest.mark.parametrize("choice", ["auto", "none", None])
def test_parse_auto_or_none_tool_choice_constrains_nothing(ctx: ProtocolContext, choice: str | None) -> None:
    tool = {"type": "function", "function": {"name": "f"}}
    request = parse(ctx, messages=[USER], tools=[tool], tool_choice=choice).request
    assert request.grammar is None and not request.forced_tool_calls


TOOLS: Any = [
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "g"}},
]


@pytest.mark.parametrize(
    ("fields", "name", "required", "parallel"),
    [
        ({"tool_choice": "required"}, None, True, True),
        ({"tool_choice": "required", "parallel_tool_calls": False}, None, True, False),
        ({"tool_choice": {"type": "function", "function": {"name": "g"}}}, "g", False, False),
    ],
)
def test_parse_forced_tool_choice_is_a_tool_call_grammar(
    ctx: ProtocolContext, fields: Any, name: str | None, required: bool, parallel: bool
) -> None:
    request = parse(ctx, messages=[USER], tools=TOOLS, **fields).request
    assert request.forced_tool_calls and request.tools is not None
    assert request.grammar == structured.forced_calls(request.tools, name, required, parallel)
    assert tuple(ctx.tokenizer.chat_calls[-1].tools) == request.tools  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "h"}}},
            "`tool_choice` names the function 'h', which is not among the tools offered ('f', 'g')",
        ),
        ({"tool_choice": "required"}, "`tool_choice` forces a tool call but no tools are offered"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, None),
    ],
)
def test_parse_rejects_a_forced_tool_choice_it_cannot_meet(
    ctx: ProtocolContext, fields: Any, message: str | None
) -> None:
    err = parse_error(ctx, messages=[USER], **fields)
    assert err.param == "tool_choice" and (message is None or err.message == message)


def test_parse_forced_call_with_response_format_follows_the_tool_with_a_warning(ctx: ProtocolContext) -> None:
    # instructor's tools modes send both, as OpenAI accepts: the call's arguments follow the tool.
    job = parse(
        ctx, messages=[USER], tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}
    )
    assert job.request.forced_tool_calls and job.request.tools is not None
    assert job.request.grammar == structured.forced_calls(job.request.tools, None, True, True)
    assert [w for w in job.warnings if "`response_format` did not apply" in w]


@pytest.mark.parametrize("field", ["functions", "function_call", "audio"])
def test_parse_rejects_legacy_functions_and_audio(ctx: ProtocolContext, field: str) -> None:
    value: Any = {"voice": "alloy", "format": "wav"} if field == "audio" else [{"name": "f"}]
    err = parse_error(ctx, messages=[USER], **{field: value})
    assert err.param == field and err.message.endswith("is not supported yet")


# --- JSON answer --------------------------------------------------------------------------------


def test_to_json_matches_openai_shape(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=[USER])
    result = Result("Hello!", FinishReason.STOP, Usage(12, 3, cached_tokens=8))
    body = orjson.loads(FORMAT.to_json(job, [result], ctx))
    assert body == {
        "id": job.request.id,
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "m",
        "system_fingerprint": body["system_fingerprint"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello!", "refusal": None, "annotations": []},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 3,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 8},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
    }
    sdk = ChatCompletion.model_validate(body)
    assert sdk.choices[0].message.content == "Hello!"
    assert sdk.usage is not None and sdk.usage.prompt_tokens_details is not None
    assert sdk.usage.prompt_tokens_details.cached_tokens == 8


def test_to_json_reports_length_finish(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=[USER], max_tokens=1)
    body = orjson.loads(FORMAT.to_json(job, [Result("", FinishReason.LENGTH, Usage(5, 1))], ctx))
    sdk = ChatCompletion.model_validate(body)
    assert (sdk.choices[0].finish_reason, sdk.choices[0].message.content) == ("length", "")


# --- streaming ------------------------------------------------------------------------------


def run_stream(job: Job, ctx: ProtocolContext, texts: list[str]) -> Frames:
    renderer = FORMAT.renderer(job, ctx)
    out = renderer.start()
    for text in texts:
        out += renderer.delta(TextDelta(text))
    return out + renderer.finish(Finished(FinishReason.STOP, Usage(4, len(texts))))


def test_stream_frames_match_openai_sequence(ctx: ProtocolContext, sse_frames: Split) -> None:
    job = parse(ctx, messages=[USER], stream=True)
    frames = sse_frames(run_stream(job, ctx, ["Hel", "lo"]))
    head = {
        "id": job.request.id,
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "m",
        "system_fingerprint": frames[0]["system_fingerprint"],
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    assert frames == [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hel"}),
        chunk({"content": "lo"}),
        chunk({}, "stop"),
        "[DONE]",
    ]
    for frame in frames[:-1]:
        ChatCompletionChunk.model_validate(frame)


def test_stream_with_usage_adds_usage_chunk(ctx: ProtocolContext, sse_frames: Split) -> None:
    job = parse(ctx, messages=[USER], stream=True, stream_options={"include_usage": True})
    frames = sse_frames(run_stream(job, ctx, ["a", "b", "c"]))
    assert [f["usage"] for f in frames[:-2]] == [None] * 5
    assert frames[-2]["choices"] == []
    assert frames[-2]["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 3,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
    assert frames[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(f) for f in frames[:-1]]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "abc"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 7


def test_stream_skips_empty_deltas(ctx: ProtocolContext) -> None:
    renderer = FORMAT.renderer(parse(ctx, messages=[USER], stream=True), ctx)
    assert renderer.delta(TextDelta("", token_ids=(5,))) == []


def test_stream_error_frame_then_done(ctx: ProtocolContext, sse_frames: Split) -> None:
    renderer = FORMAT.renderer(parse(ctx, messages=[USER], stream=True), ctx)
    frames = sse_frames(renderer.error(EngineFailed("engine crashed")))
    assert frames == [
        {"error": {"message": "engine crashed", "type": "server_error", "param": None, "code": None}},
        "[DONE]",
    ]


def test_stream_heartbeat_is_sse_comment(ctx: ProtocolContext) -> None:
    renderer = FORMAT.renderer(parse(ctx, messages=[USER], stream=True), ctx)
    assert renderer.heartbeat() == KEEP_ALIVE


def test_n_choices_render_indexed_and_usage_combined(ctx: ProtocolContext, sse_frames: Split) -> None:
    job = parse(ctx, messages=[USER], n=2, stream=True, stream_options={"include_usage": True})
    assert job.n == 2
    results = [
        Result("a", FinishReason.STOP, Usage(7, 2, 3)),
        Result("bb", FinishReason.LENGTH, Usage(7, 4, 6)),
    ]
    body = orjson.loads(FORMAT.to_json(job, results, ctx))
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert [c["message"]["content"] for c in body["choices"]] == ["a", "bb"]
    assert body["usage"]["prompt_tokens"] == 7 and body["usage"]["completion_tokens"] == 6
    stream = FORMAT.renderer(job, ctx)
    first_finish = stream.finish(Finished(FinishReason.STOP, Usage(7, 2)), 0)
    assert DONE not in first_finish  # the other choice is still running
    frames = sse_frames(stream.finish(Finished(FinishReason.LENGTH, Usage(7, 4)), 1))
    assert frames[-1] == "[DONE]"
    assert frames[-2]["usage"]["completion_tokens"] == 6
    primer = sse_frames(stream.start())
    assert [c["choices"][0]["delta"]["role"] for c in primer] == ["assistant"] * 2


def test_parse_logprobs_true_with_top_logprobs(ctx: ProtocolContext) -> None:
    assert parse(ctx, messages=[USER]).request.logprobs is None
    assert parse(ctx, messages=[USER], logprobs=True).request.logprobs == 0
    assert parse(ctx, messages=[USER], logprobs=True, top_logprobs=5).request.logprobs == 5
    assert parse_error(ctx, messages=[USER], top_logprobs=2).param == "top_logprobs"
    assert parse_error(ctx, messages=[USER], logprobs=True, top_logprobs=21).param == "top_logprobs"


def test_logprobs_render_in_openai_shape(ctx: ProtocolContext, sse_frames: Split) -> None:
    job = parse(ctx, messages=[USER], logprobs=True, top_logprobs=2)
    entry = TokenLogprob("Hi", -0.1, (("Hi", -0.1), ("Hey", -2.5)))
    body = orjson.loads(
        FORMAT.to_json(job, [Result("Hi", FinishReason.STOP, Usage(3, 1), logprobs=(entry,))], ctx)
    )
    parsed = openai.types.chat.ChatCompletion.model_validate(body)
    content = parsed.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content[0].token == "Hi" and content[0].bytes == [72, 105]  # type: ignore[index]
    assert [t.token for t in content[0].top_logprobs] == ["Hi", "Hey"]  # type: ignore[index]
    [chunk] = sse_frames(FORMAT.renderer(job, ctx).delta(TextDelta("Hi", (1,), (entry,))))
    assert chunk["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.1


def test_parse_reasoning_effort_switches_thinking(ctx: ProtocolContext) -> None:
    tok = ctx.tokenizer
    parse(ctx, messages=[USER], reasoning_effort="none")
    assert tok.chat_calls[-1].template_kwargs["enable_thinking"] is False  # type: ignore[attr-defined]
    parse(ctx, messages=[USER], reasoning_effort="high")
    assert tok.chat_calls[-1].template_kwargs["enable_thinking"] is True  # type: ignore[attr-defined]
    parse(ctx, messages=[USER], reasoning_effort="high", chat_template_kwargs={"enable_thinking": False})
    assert tok.chat_calls[-1].template_kwargs["enable_thinking"] is False  # type: ignore[attr-defined]
    assert parse_error(ctx, messages=[USER], reasoning_effort="max").param == "reasoning_effort"


@pytest.mark.parametrize(
    ("fields", "warned"), [({}, True), ({"max_tokens": 9}, False), ({"max_completion_tokens": 9}, False)]
)
def test_parse_warns_when_the_servers_default_limit_applies(
    ctx: ProtocolContext, fields: Any, warned: bool
) -> None:
    # A client that set no limit is told the answer stops at --max-tokens (finish_reason length).
    job = parse(ctx, messages=[USER], **fields)
    limit = f"stops at the server's default of {ctx.defaults.max_tokens} tokens (--max-tokens)"
    assert [w for w in job.warnings if limit in w] == ([job.warnings[0]] if warned else [])
    assert job.request.max_tokens == fields.get("max_tokens", fields.get("max_completion_tokens", 256))


def test_parse_thinking_budget_reaches_the_engine_request(ctx: ProtocolContext) -> None:
    thinking = replace(ctx, tokenizer=replace(ctx.tokenizer, thinks=True))  # type: ignore[type-var]
    request = parse(thinking, messages=[USER], thinking_budget_tokens=9, thinking_budget_message="ok").request
    assert (request.thinking_budget, request.thinking_budget_message) == (9, tuple(b"ok"))
    assert parse(thinking, messages=[USER], reasoning_effort="none").request.thinking_budget == 0
    assert parse(thinking, messages=[USER]).request.thinking_budget is None


def test_parse_refuses_a_thinking_budget_below_minus_one(ctx: ProtocolContext) -> None:
    assert parse_error(ctx, messages=[USER], thinking_budget_tokens=-2).param == "thinking_budget_tokens"
