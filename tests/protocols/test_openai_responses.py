"""POST /v1/responses and GET/DELETE /v1/responses/{id}: input items to templates, events to
the Responses shapes, the store; checked against the openai SDK's own types and its client."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import orjson
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from mlx_serve.engine.errors import EngineFailed, InvalidRequest, QueueFull, ServeError
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
from mlx_serve.protocols import openai_responses, structured
from mlx_serve.protocols.contract import KEEP_ALIVE, NotFound, ProtocolContext, Result
from mlx_serve.protocols.openai_responses import OpenAIResponses, ResponsesJob, ResponsesStore
from tests.protocols.scripted import (
    ScriptedServer,
    render_json,
    render_stream,
    sse_events,
    text_events,
)

STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
USER: Any = {"role": "user", "content": "hi"}
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
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


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fmt() -> OpenAIResponses:
    return OpenAIResponses(ResponsesStore(ttl_s=60, max_bytes=1 << 20))


def parse(fmt: OpenAIResponses, ctx: ProtocolContext, **fields: Any) -> ResponsesJob:
    return fmt.parse(orjson.dumps({"model": "m", **fields}), ctx)


def parse_error(fmt: OpenAIResponses, ctx: ProtocolContext, **fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse(fmt, ctx, **fields)
    assert info.value.status == 400
    return info.value


def rendered(ctx: ProtocolContext) -> Any:
    return ctx.tokenizer.chat_calls[-1]  # type: ignore[attr-defined]


def answer(fmt: OpenAIResponses, ctx: ProtocolContext, events: list[Event], **fields: Any) -> dict[str, Any]:
    job = parse(fmt, ctx, **fields)
    body: dict[str, Any] = orjson.loads(render_json(fmt, job, ctx, events))
    Response.model_validate(body)
    return body


@pytest.fixture
def server(fmt: OpenAIResponses, ctx: ProtocolContext) -> ScriptedServer:
    srv = ScriptedServer(fmt, ctx, "/v1/responses")

    def by_id(request: httpx2.Request) -> tuple[int, bytes]:
        response_id = request.url.path.removeprefix("/v1/responses/")
        if request.method == "DELETE":
            return fmt.delete(response_id)
        return fmt.retrieve(response_id, request.url.query)

    original = srv.handle

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.url.path.startswith("/v1/responses/"):
            srv.routes[(request.method, request.url.path)] = by_id
        return original(request)

    srv.handle = handle  # type: ignore[method-assign]
    return srv


@pytest.fixture
def client(server: ScriptedServer) -> Iterator[openai.OpenAI]:
    http = httpx2.Client(transport=server.transport())
    yield openai.OpenAI(
        api_key="k",
        base_url="http://mlx-serve/v1",
        http_client=http,
        max_retries=0,
        _strict_response_validation=True,
    )
    http.close()


# --- parse: the conversation ------------------------------------------------------------------


def test_parse_string_input_renders_like_openai_chat(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    job = parse(fmt, ctx, input="hi", instructions="be brief")
    assert rendered(ctx).messages == [{"role": "system", "content": "be brief"}, USER]
    assert job.request.prompt_tokens == tuple(ctx.tokenizer.encode("<system>be brief<user>hi<assistant>"))
    assert job.request.id.startswith("resp_") and len(job.request.id) == 5 + 32
    assert (job.model, job.stream, job.store, job.request.max_tokens) == ("m", False, True, 256)


def test_parse_merges_instructions_and_leading_system_items(
    fmt: OpenAIResponses, ctx: ProtocolContext
) -> None:
    items = [
        {"role": "developer", "content": "dev rules"},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"role": "system", "content": [{"type": "input_text", "text": "late system"}]},
    ]
    parse(fmt, ctx, input=items, instructions="top")
    # A system item after the conversation began stays where it is: the tokens before it hold.
    assert rendered(ctx).messages == [
        {"role": "system", "content": "top\n\ndev rules"},
        {"role": "user", "content": "a\n\nb"},
        {"role": "system", "content": "late system"},
    ]


def test_parse_turns_calls_outputs_and_reasoning_into_template_turns(
    fmt: OpenAIResponses, ctx: ProtocolContext
) -> None:
    items = [
        USER,
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "sum"}],
            "content": [{"type": "reasoning_text", "text": "full thought"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
        },
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
            "id": "fc_1",
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "only"}]},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": ""},
        {
            "type": "function_call_output",
            "call_id": "call_2",
            "output": [{"type": "input_text", "text": "rain"}],
        },
    ]
    parse(fmt, ctx, input=items, tools=[WEATHER])
    assert rendered(ctx).messages[1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "full thought",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "only",
            "tool_calls": [
                {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {}}}
            ],
        },
        {"role": "tool", "content": "rain", "tool_call_id": "call_2"},
    ]


def test_parse_passes_function_tools(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    parse(fmt, ctx, input="hi", tools=[WEATHER, {"type": "function", "name": "now"}], tool_choice="auto")
    assert rendered(ctx).tools == [
        {
            "function": {
                "name": "get_weather",
                "description": "Weather now",
                "parameters": WEATHER["parameters"],
            },
            "type": "function",
        },
        {"function": {"name": "now"}, "type": "function"},
    ]
    parse(fmt, ctx, input="hi", tools=[WEATHER], tool_choice="none")
    assert rendered(ctx).tools is None


SCHEMA: Any = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("text_format", "grammar"),
    [
        (
            {"type": "json_schema", "name": "thing", "schema": SCHEMA, "strict": True},
            structured.json_schema(SCHEMA, "p"),
        ),
        ({"type": "json_object"}, structured.json_schema(None, "p")),
        ({"type": "text"}, None),
    ],
)
def test_parse_text_format_is_the_answers_grammar(
    fmt: OpenAIResponses, ctx: ProtocolContext, text_format: Any, grammar: str | None
) -> None:
    job = parse(fmt, ctx, input="hi", text={"format": text_format})
    assert job.request.grammar == grammar and not job.request.forced_tool_calls
    assert job.echo["text"]["format"] == text_format


@pytest.mark.parametrize(
    ("fields", "name", "required", "parallel"),
    [
        ({"tool_choice": "required"}, None, True, True),
        ({"tool_choice": "required", "parallel_tool_calls": False}, None, True, False),
        ({"tool_choice": {"type": "function", "name": "now"}}, "now", False, False),
    ],
)
def test_parse_forced_tool_choice_is_a_tool_call_grammar(
    fmt: OpenAIResponses, ctx: ProtocolContext, fields: Any, name: str | None, required: bool, parallel: bool
) -> None:
    job = parse(fmt, ctx, input="hi", tools=[WEATHER, {"type": "function", "name": "now"}], **fields)
    assert job.request.forced_tool_calls and job.request.tools is not None
    assert job.request.grammar == structured.forced_calls(job.request.tools, name, required, parallel)
    assert job.echo["tool_choice"] == fields["tool_choice"]


def test_parse_forced_tool_choice_with_text_format_follows_the_tool_with_a_warning(
    fmt: OpenAIResponses, ctx: ProtocolContext
) -> None:
    # instructor's Mode.RESPONSES_TOOLS sends both; OpenAI accepts the pair.
    job = parse(
        fmt,
        ctx,
        input="hi",
        tools=[WEATHER],
        tool_choice="required",
        text={"format": {"type": "json_object"}},
    )
    assert job.request.forced_tool_calls and job.request.tools is not None
    assert job.request.grammar == structured.forced_calls(job.request.tools, None, True, True)
    assert [w for w in job.warnings if "`text.format` did not apply" in w]


@pytest.mark.parametrize(
    ("reasoning", "enable"),
    [
        (None, False),
        ({"effort": "high"}, True),
        ({"effort": "minimal"}, True),
        ({"effort": "none"}, False),
        ({"summary": "auto"}, False),
    ],
)
def test_parse_maps_reasoning_effort_to_template_switch(
    fmt: OpenAIResponses, ctx: ProtocolContext, reasoning: Any, enable: bool
) -> None:
    parse(fmt, ctx, input="hi", **({} if reasoning is None else {"reasoning": reasoning}))
    assert rendered(ctx).template_kwargs["enable_thinking"] is enable


def test_parse_resolves_sampling_and_limits(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    job = parse(fmt, ctx, input="hi")
    assert job.request.sampling == SamplingParams(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05)
    job = parse(
        fmt,
        ctx,
        input="hi",
        temperature=0,
        top_p=0.5,
        top_k=-1,
        max_output_tokens=9,
        stream=True,
        store=False,
    )
    assert job.request.sampling == SamplingParams(temperature=0.0, top_p=0.5, top_k=0, min_p=0.05)
    assert (job.request.max_tokens, job.stream, job.store) == (9, True, False)


def test_parse_accepts_fields_the_sdk_sends(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    job = parse(
        fmt,
        ctx,
        input="hi",
        metadata={"k": "v"},
        parallel_tool_calls=False,
        max_tool_calls=3,
        include=["reasoning.encrypted_content"],
        truncation="auto",
        user="u",
        safety_identifier="s",
        prompt_cache_key="p",
        service_tier="auto",
        stream_options={"include_obfuscation": False},
        text={"verbosity": "low"},
        top_logprobs=0,
        background=False,
        something_new=[1],
    )
    assert job.echo["metadata"] == {"k": "v"} and job.echo["parallel_tool_calls"] is False


# --- parse: refusals --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "kind"),
    [
        ({"type": "input_image", "image_url": "http://x/y.png"}, "vision"),
        ({"type": "input_file", "file_id": "f"}, "file"),
        ({"type": "input_audio", "input_audio": {}}, "audio"),
    ],
)
def test_parse_refuses_media_input(
    fmt: OpenAIResponses, ctx: ProtocolContext, part: dict[str, Any], kind: str
) -> None:
    content = [{"type": "input_text", "text": "look"}, part]
    err = parse_error(fmt, ctx, input=[USER, {"role": "user", "content": content}])
    assert (err.message, err.param) == (f"this model has no {kind} input", "input[1].content[1]")


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "foo"}}}},
            "text.format.schema",
            "invalid JSON schema: Invalid type: foo",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "name": "now"}},
            "tool_choice",
            ("`tool_choice` names the tool 'now', which is not among the tools offered ('get_weather')"),
        ),
        (
            {"tools": [{"type": "local_shell"}]},
            "tools[0].type",
            (
                "tool type 'local_shell' is not supported: only function, custom and namespace tools "
                "(and, left out with a Warning, the tools the API's servers run)"
            ),
        ),
        (
            {"tools": [{"type": "function"}]},
            "tools[0].name",
            "invalid request: Object missing required field `name` - at `$.tools[0]`",
        ),
        ({"top_logprobs": 2}, "top_logprobs", "`top_logprobs` is not supported yet"),
        (
            {"include": ["message.output_text.logprobs"]},
            "include",
            "`include` of 'message.output_text.logprobs' is not supported yet",
        ),
        ({"background": True}, "background", "`background` is not supported yet"),
        ({"conversation": "conv_1"}, "conversation", "`conversation` is not supported yet"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "`prompt` is not supported yet"),
        (
            {"context_management": [{"type": "compaction"}]},
            "context_management",
            "`context_management` is not supported yet",
        ),
    ],
)
def test_parse_refuses_what_it_cannot_honour(
    fmt: OpenAIResponses, ctx: ProtocolContext, fields: dict[str, Any], param: str, message: str
) -> None:
    err = parse_error(fmt, ctx, input="hi", **fields)
    assert (err.param, err.message) == (param, message)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": 5}, "input"),
        ({"input": [{"content": "hi"}]}, "input[0].role"),
        ({"input": [USER, {"role": "robot", "content": "x"}]}, "input[1].role"),
        ({"input": [{"type": "web_search_call", "id": "ws"}]}, "input[0].type"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{x"}]},
            "input[0].arguments",
        ),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "temperature": 3}, "temperature"),
        ({"input": "hi", "top_p": 2}, "top_p"),
        ({"input": "hi", "truncation": "sometimes"}, "truncation"),
        ({"input": "hi", "tools": [{"name": "f"}]}, "tools[0].type"),
        ({"input": "hi", "metadata": {"k": 1}}, "metadata[...]"),
    ],
)
def test_parse_rejects_malformed_requests(
    fmt: OpenAIResponses, ctx: ProtocolContext, fields: dict[str, Any], param: str
) -> None:
    assert parse_error(fmt, ctx, **fields).param == param


def test_parse_rejects_malformed_json(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    with pytest.raises(InvalidRequest) as info:
        fmt.parse(b"{", ctx)
    assert info.value.message.startswith("could not parse JSON body: ")


def test_parse_reports_template_errors_as_400(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    ctx.tokenizer.template_error = "chat template failed: bad"  # type: ignore[attr-defined]
    err = parse_error(fmt, ctx, input="hi")
    assert (err.message, err.param) == ("chat template failed: bad", "input")


def test_parse_unknown_previous_response_is_404(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    with pytest.raises(NotFound) as info:
        parse(fmt, ctx, input="hi", previous_response_id="resp_nope")
    assert (info.value.status, info.value.param) == (404, "previous_response_id")
    assert orjson.loads(fmt.error_body(info.value)) == {
        "error": {
            "message": "Previous response with id 'resp_nope' not found.",
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": None,
        }
    }


# --- JSON answers -----------------------------------------------------------------------------


def test_to_json_matches_responses_shape(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    job = parse(fmt, ctx, input="hi", instructions="be brief", max_output_tokens=50, metadata={"k": "v"})
    result = Result("Hello!", FinishReason.STOP, Usage(12, 3, cached_tokens=8))
    body = orjson.loads(fmt.to_json(job, [result], ctx))
    message = body["output"][0]
    assert message["id"].startswith("msg_")
    assert body == {
        "id": job.request.id,
        "object": "response",
        "created_at": 1_700_000_000,
        "status": "completed",
        "background": False,
        "completed_at": body["completed_at"],
        "error": None,
        "incomplete_details": None,
        "model": "m",
        "output": [
            {
                "id": message["id"],
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "Hello!"}],
            }
        ],
        "instructions": "be brief",
        "max_output_tokens": 50,
        "max_tool_calls": None,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": True,
        "temperature": 0.7,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_logprobs": 0,
        "top_p": 0.9,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "truncation": "disabled",
        "user": None,
        "safety_identifier": None,
        "prompt_cache_key": None,
        "metadata": {"k": "v"},
        "usage": {
            "input_tokens": 12,
            "input_tokens_details": {"cached_tokens": 8, "cache_write_tokens": 0},
            "output_tokens": 3,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 15,
        },
    }
    sdk = Response.model_validate(body)
    assert sdk.output_text == "Hello!" and body["completed_at"] >= 1_700_000_000


def test_to_json_length_is_incomplete(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    body = answer(fmt, ctx, text_events("cut", reason=FinishReason.LENGTH), input="hi")
    assert (body["status"], body["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert body["output"][0]["status"] == "incomplete" and body["completed_at"] is None


def test_to_json_items_for_reasoning_text_and_calls(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    body = answer(fmt, ctx, TOOL_TURN, input="hi", tools=[WEATHER])
    kinds = [(i["type"], i["id"][:3]) for i in body["output"]]
    assert kinds == [
        ("reasoning", "rs_"),
        ("message", "msg"),
        ("function_call", "fc_"),
        ("function_call", "fc_"),
    ]
    assert body["output"][0]["content"] == [{"type": "reasoning_text", "text": "The user wants weather."}]
    calls = [(i["call_id"], i["name"], i["arguments"], i["status"]) for i in body["output"][2:]]
    assert calls == [
        ("call_abc", "get_weather", '{"city": "Paris"}', "completed"),
        ("call_def", "get_weather", '{"city": "Rome"}', "completed"),
    ]
    assert body["tools"] == [{**WEATHER}]


def test_to_json_empty_answer_has_no_items(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    assert answer(fmt, ctx, text_events(), input="hi")["output"] == []


def test_to_json_stores_unless_asked_not_to(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    kept = answer(fmt, ctx, text_events("a"), input="hi")
    assert fmt.retrieve(kept["id"]) == (200, orjson.dumps(kept))
    dropped = answer(fmt, ctx, text_events("a"), input="hi", store=False)
    assert fmt.retrieve(dropped["id"])[0] == 404 and dropped["store"] is False


# --- previous_response_id and the store endpoints ---------------------------------------------


def test_previous_response_rebuilds_the_conversation(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    first = answer(fmt, ctx, TOOL_TURN, input="weather?", instructions="old rules", tools=[WEATHER])
    outputs = [
        {"type": "function_call_output", "call_id": c, "output": "sunny"} for c in ("call_abc", "call_def")
    ]
    second = answer(
        fmt,
        ctx,
        text_events("Sunny."),
        input=outputs,
        previous_response_id=first["id"],
        instructions="new rules",
    )
    answer(fmt, ctx, text_events("Bye."), input="thanks", previous_response_id=second["id"])
    assert rendered(ctx).messages == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "The user wants weather.",
            "tool_calls": [
                {
                    "id": "call_abc",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                },
                {
                    "id": "call_def",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Rome"}},
                },
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_abc"},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_def"},
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "thanks"},
    ]


def test_previous_response_drops_old_instructions(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    first = answer(fmt, ctx, text_events("a"), input="hi", instructions="old rules")
    answer(
        fmt, ctx, text_events("b"), input="more", previous_response_id=first["id"], instructions="new rules"
    )
    assert rendered(ctx).messages[0] == {"role": "system", "content": "new rules"}
    answer(fmt, ctx, text_events("b"), input="more", previous_response_id=first["id"])
    assert rendered(ctx).messages[0] == USER


def test_previous_response_keeps_a_call_cut_short(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    events: list[Event] = [
        ToolCallStart(0, "call_1", "f"),
        ToolCallArgsDelta(0, '{"a": '),
        Finished(FinishReason.LENGTH, Usage(3, 4)),
    ]
    first = answer(fmt, ctx, events, input="hi", max_output_tokens=4)
    assert first["output"][0]["status"] == "incomplete"
    answer(fmt, ctx, text_events("ok"), input="go on", previous_response_id=first["id"])
    assert rendered(ctx).messages[1]["tool_calls"][0]["function"]["arguments"] == '{"a": '


def test_retrieve_and_delete(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    kept = answer(fmt, ctx, text_events("a"), input="hi")
    status, body = fmt.retrieve(kept["id"], b"include[]=reasoning.encrypted_content")
    assert status == 200 and Response.model_validate(orjson.loads(body)).id == kept["id"]
    assert fmt.delete(kept["id"]) == (
        200,
        orjson.dumps({"id": kept["id"], "object": "response.deleted", "deleted": True}),
    )
    for status, body in (fmt.retrieve(kept["id"]), fmt.delete(kept["id"])):
        assert status == 404
        assert orjson.loads(body) == {
            "error": {
                "message": f"Response with id '{kept['id']}' not found.",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }


def test_retrieve_refuses_streaming_a_stored_response(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    kept = answer(fmt, ctx, text_events("a"), input="hi")
    status, body = fmt.retrieve(kept["id"], b"stream=true")
    assert status == 400 and orjson.loads(body)["error"]["param"] == "stream"


def test_store_expires_entries_after_ttl() -> None:
    clock = Clock()
    store = ResponsesStore(ttl_s=10, max_bytes=1000, clock=clock)
    store.put("a", b"{}", (), 10)
    clock.now += 9.9
    assert store.get("a") is not None
    clock.now += 0.2
    assert store.get("a") is None and store.bytes_used == 0 and len(store) == 0


def test_store_evicts_and_expires_entries_of_every_owner() -> None:
    clock = Clock()
    store = ResponsesStore(ttl_s=10, max_bytes=100, clock=clock)
    for name, owner in (("a", "alice"), ("b", "bob"), ("c", "bob")):
        store.put(name, b"{}", (), 40, owner=owner)
    assert store.get("a", "alice") is None and len(store) == 2  # the oldest went, whoever owned it
    assert store.get("b", "alice") is None and store.get("b", "bob") is not None
    clock.now += 11
    assert store.get("c", "bob") is None and len(store) == 0 and store.bytes_used == 0


def test_store_evicts_oldest_past_byte_cap() -> None:
    store = ResponsesStore(ttl_s=10, max_bytes=100, clock=Clock())
    for name in "abc":
        store.put(name, b"{}", (), 40)
    assert (store.get("a"), len(store), store.bytes_used) == (None, 2, 80)
    store.put("huge", b"{}", (), 101)
    assert store.get("huge") is None and len(store) == 2
    store.put("b", b"{}", (), 50)
    assert [store.get(k) is not None for k in "bc"] == [True, True] and store.bytes_used == 90


def test_store_counts_what_a_response_adds(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    first = answer(fmt, ctx, text_events("a" * 50), input="hi")
    used = fmt.store.bytes_used
    answer(fmt, ctx, text_events("b"), input="x", previous_response_id=first["id"])
    assert used < fmt.store.bytes_used < 2 * used + 200


# --- streaming --------------------------------------------------------------------------------


def stream_of(
    fmt: OpenAIResponses,
    ctx: ProtocolContext,
    events: list[Event],
    fail: ServeError | None = None,
    **fields: Any,
) -> list[dict[str, Any]]:
    job = parse(fmt, ctx, input="hi", stream=True, **fields)
    frames = sse_events(render_stream(fmt, job, ctx, events, fail))
    assert frames.pop() == (None, "[DONE]")  # Open Responses' terminal event
    for name, data in frames:
        assert name == data["type"]
        STREAM_EVENT.validate_python(data)
    assert [d["sequence_number"] for _, d in frames] == list(range(len(frames)))
    return [d for _, d in frames]


def test_stream_text_event_chain(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    frames = stream_of(fmt, ctx, text_events("Hel", "", "lo"))
    assert [f["type"] for f in frames] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    created = frames[0]["response"]
    assert (created["status"], created["output"], created["usage"]) == ("in_progress", [], None)
    item_id = frames[2]["item"]["id"]
    assert frames[4] == {
        "type": "response.output_text.delta",
        "item_id": item_id,
        "output_index": 0,
        "content_index": 0,
        "delta": "Hel",
        "logprobs": [],
        "sequence_number": 4,
    }
    assert frames[6]["text"] == "Hello" and frames[8]["item"]["status"] == "completed"
    final = Response.model_validate(frames[-1]["response"])
    assert final.status == "completed" and final.output_text == "Hello"


def test_stream_reasoning_text_and_calls(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    frames = stream_of(fmt, ctx, TOOL_TURN, tools=[WEATHER])
    added = [
        (f["output_index"], f["item"]["type"]) for f in frames if f["type"] == "response.output_item.added"
    ]
    assert added == [(0, "reasoning"), (1, "message"), (2, "function_call"), (3, "function_call")]
    reasoning = [f["delta"] for f in frames if f["type"] == "response.reasoning_text.delta"]
    args = [
        (f["output_index"], f["delta"])
        for f in frames
        if f["type"] == "response.function_call_arguments.delta"
    ]
    assert reasoning == ["The user wants ", "weather."]
    assert args == [(2, '{"city": '), (2, '"Paris"}'), (3, '{"city": "Rome"}')]
    done = [f["arguments"] for f in frames if f["type"] == "response.function_call_arguments.done"]
    assert done == ['{"city": "Paris"}', '{"city": "Rome"}']
    final = frames[-1]["response"]
    assert [i["call_id"] for i in final["output"][2:]] == ["call_abc", "call_def"]
    assert final["usage"]["input_tokens_details"]["cached_tokens"] == 8


def test_stream_and_json_give_the_same_response(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    streamed = stream_of(fmt, ctx, TOOL_TURN, tools=[WEATHER])[-1]["response"]
    whole = answer(fmt, ctx, TOOL_TURN, input="hi", tools=[WEATHER])

    def strip(r: dict[str, Any]) -> dict[str, Any]:
        return {**r, "id": "", "completed_at": 0, "output": [{**i, "id": ""} for i in r["output"]]}

    assert strip(streamed) == strip(whole)


def test_stream_length_ends_incomplete(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    frames = stream_of(fmt, ctx, text_events("cut", reason=FinishReason.LENGTH))
    assert frames[-1]["type"] == "response.incomplete"
    assert frames[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert frames[-2]["item"]["status"] == "incomplete"


def test_stream_stores_the_finished_response(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    final = stream_of(fmt, ctx, text_events("a"))[-1]["response"]
    assert orjson.loads(fmt.retrieve(final["id"])[1]) == final


def test_stream_error_is_response_failed(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    frames = stream_of(fmt, ctx, [TextDelta("par")], fail=EngineFailed("engine crashed"))
    assert [f["type"] for f in frames[-5:]] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "error",
        "response.failed",
    ]
    assert frames[-2]["error"] == frames[-1]["response"]["error"]  # Open Responses' shape
    assert (frames[-2]["code"], frames[-2]["message"]) == ("server_error", "engine crashed")  # OpenAI's
    failed = frames[-1]["response"]
    assert failed["status"] == "failed" and failed["output"][0]["status"] == "incomplete"
    assert failed["error"] == {
        "code": "server_error",
        "message": "engine crashed",
        "param": None,
        "type": "server_error",
    }
    assert fmt.retrieve(failed["id"])[0] == 404


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (QueueFull("busy"), "rate_limit_exceeded"),
        (InvalidRequest("bad"), "invalid_prompt"),
        (EngineFailed("x"), "server_error"),
    ],
)
def test_stream_failure_codes(fmt: OpenAIResponses, ctx: ProtocolContext, exc: ServeError, code: str) -> None:
    assert stream_of(fmt, ctx, [], fail=exc)[-1]["response"]["error"]["code"] == code


def test_stream_heartbeat_and_empty_deltas(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    renderer = fmt.renderer(parse(fmt, ctx, input="hi", stream=True), ctx)
    assert renderer.heartbeat() == KEEP_ALIVE
    for ev in (TextDelta(""), ReasoningDelta(""), ToolCallArgsDelta(0, "{}")):
        assert renderer.delta(ev) == []


def test_renderer_rejects_foreign_jobs(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    from mlx_serve.protocols import openai_chat

    job = openai_chat.FORMAT.parse(orjson.dumps({"messages": [USER]}), ctx)
    with pytest.raises(TypeError):
        fmt.renderer(job, ctx)


# --- the SDK as client ------------------------------------------------------------------------


def test_sdk_create_stream_and_continue(
    client: openai.OpenAI, server: ScriptedServer, ctx: ProtocolContext
) -> None:
    server.events = TOOL_TURN
    first = client.responses.create(model="m", input="weather?", tools=[WEATHER])
    calls = [i for i in first.output if i.type == "function_call"]
    assert [c.call_id for c in calls] == ["call_abc", "call_def"]
    with client.responses.stream(model="m", input="weather?", tools=[WEATHER]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.output_text == first.output_text == "Let me check."
    server.events = text_events("Sunny.")
    second = client.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": c.call_id, "output": "sunny"} for c in calls],
    )
    assert second.output_text == "Sunny." and second.previous_response_id == first.id
    assert [m["role"] for m in rendered(ctx).messages] == ["user", "assistant", "tool", "tool"]


def test_sdk_retrieve_delete_and_404(client: openai.OpenAI) -> None:
    made = client.responses.create(model="m", input="hi")
    assert client.responses.retrieve(made.id).output_text == "Hello!"
    client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.retrieve(made.id)
    assert info.value.body == {
        "message": f"Response with id '{made.id}' not found.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="m", input="hi", previous_response_id=made.id)


def test_sdk_bad_request_error(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="m",
            input="hi",
            text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "foo"}}},
        )
    assert info.value.param == "text.format.schema" and info.value.type == "invalid_request_error"
    assert "Invalid type: foo" in info.value.message


def test_sdk_stream_failure_surfaces(client: openai.OpenAI, server: ScriptedServer) -> None:
    server.events, server.fail = [TextDelta("par")], EngineFailed("engine crashed")
    with pytest.raises(openai.APIError) as info, client.responses.stream(model="m", input="hi") as stream:
        list(stream)
    assert info.value.message == "engine crashed"


def test_sdk_incomplete_response(client: openai.OpenAI, server: ScriptedServer) -> None:
    server.events = text_events("cut", reason=FinishReason.LENGTH)
    r = client.responses.create(model="m", input="hi", max_output_tokens=16)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and r.output_text == "cut"


def test_error_body_is_openai_envelope() -> None:
    assert orjson.loads(openai_responses.error_body(QueueFull("busy"))) == {
        "error": {"message": "busy", "type": "requests", "param": None, "code": "rate_limit_exceeded"}
    }
