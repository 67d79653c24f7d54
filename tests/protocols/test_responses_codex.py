"""Codex's Responses requests and Open Responses in full: namespace tools flattened, hosted tools
left out with a Warning, custom (freeform) tools, reasoning replayed from encrypted_content,
compaction, item references, allowed_tools, output limits, and every field the specification
requires on every object and event; checked with the openai SDK's types and client."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import httpx2
import openai
import orjson
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent, ResponseUsage

from mlx_serve.engine.errors import EngineFailed, InvalidRequest
from mlx_serve.engine.types import (
    Event,
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from mlx_serve.protocols import structured
from mlx_serve.protocols.contract import NotFound, ProtocolContext, Result
from mlx_serve.protocols.openai_responses import OpenAIResponses, ResponsesJob, ResponsesStore
from mlx_serve.protocols.responses_compact import COMPACTION_PROMPT
from mlx_serve.protocols.responses_input import SUMMARY_HEADING, opaque, unwrap
from tests.protocols.scripted import ScriptedServer, render_json, render_stream, sse_events

STREAM_EVENT = pydantic.TypeAdapter(ResponseStreamEvent)
EXEC: Any = {
    "type": "function",
    "name": "exec_command",
    "description": "Runs a command",
    "strict": False,
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
}
AGENTS: Any = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Start one",
            "strict": False,
            "parameters": {},
        },
        {"type": "function", "name": "wait_agent", "description": "Wait", "strict": False, "parameters": {}},
    ],
}
PATCH: Any = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"},
}
WEB_SEARCH: Any = {"type": "web_search", "external_web_access": False}
# What Open Responses requires of a response object, of each event, and of each output item.
RESPONSE_FIELDS = {
    "id",
    "object",
    "created_at",
    "completed_at",
    "status",
    "incomplete_details",
    "model",
    "previous_response_id",
    "instructions",
    "output",
    "error",
    "tools",
    "tool_choice",
    "truncation",
    "parallel_tool_calls",
    "text",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "top_logprobs",
    "temperature",
    "reasoning",
    "user",
    "usage",
    "max_output_tokens",
    "max_tool_calls",
    "store",
    "background",
    "service_tier",
    "metadata",
    "safety_identifier",
    "prompt_cache_key",
}
EVENT_FIELDS = {
    "response.created": {"response"},
    "response.in_progress": {"response"},
    "response.completed": {"response"},
    "response.incomplete": {"response"},
    "response.failed": {"response"},
    "response.output_item.added": {"output_index", "item"},
    "response.output_item.done": {"output_index", "item"},
    "response.content_part.added": {"item_id", "output_index", "content_index", "part"},
    "response.content_part.done": {"item_id", "output_index", "content_index", "part"},
    "response.output_text.delta": {"item_id", "output_index", "content_index", "delta"},
    "response.output_text.done": {"item_id", "output_index", "content_index", "text"},
    "response.reasoning_text.delta": {"item_id", "output_index", "content_index", "delta"},
    "response.reasoning_text.done": {"item_id", "output_index", "content_index", "text"},
    "response.function_call_arguments.delta": {"item_id", "output_index", "delta"},
    "response.function_call_arguments.done": {"item_id", "output_index", "arguments"},
    "response.custom_tool_call_input.delta": {"item_id", "output_index", "delta"},
    "response.custom_tool_call_input.done": {"item_id", "output_index", "input"},
    "error": {"error"},
}
ITEM_FIELDS = {
    "message": {"id", "type", "status", "role", "content"},
    "function_call": {"id", "type", "status", "call_id", "name", "arguments"},
    "custom_tool_call": {"id", "type", "status", "call_id", "name", "input"},
    "reasoning": {"id", "type", "status", "summary"},
}


def codex_request(**over: Any) -> dict[str, Any]:
    """The shape of Codex 0.171's first request for a model it has no metadata for."""
    body = {
        "model": "local-model",
        "stream": True,
        "input": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "developer",
                "content": [{"type": "input_text", "text": "rules"}],
            },
            {
                "type": "message",
                "id": "msg_2",
                "role": "user",
                "content": [{"type": "input_text", "text": "<env/>"}],
            },
            {
                "type": "message",
                "id": "msg_3",
                "role": "user",
                "content": [{"type": "input_text", "text": "say hi"}],
            },
        ],
        "tools": [EXEC, AGENTS, WEB_SEARCH],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "thread-1",
        "client_metadata": {"x-codex-turn-metadata": "{}", "turn_id": "t"},
    }
    return {**body, **over}


@pytest.fixture
def fmt() -> OpenAIResponses:
    return OpenAIResponses(ResponsesStore(ttl_s=60, max_bytes=1 << 20))


@pytest.fixture
def long_ctx(ctx: ProtocolContext) -> ProtocolContext:
    return replace(ctx, context_length=4096)


def parse(fmt: OpenAIResponses, ctx: ProtocolContext, **fields: Any) -> ResponsesJob:
    return fmt.parse(orjson.dumps({"model": "m", **fields}), ctx)


def rendered(ctx: ProtocolContext) -> Any:
    return ctx.tokenizer.chat_calls[-1]  # type: ignore[attr-defined]


def check_item(item: dict[str, Any]) -> None:
    assert ITEM_FIELDS[item["type"]] <= set(item), item


def check_response(response: dict[str, Any]) -> None:
    assert RESPONSE_FIELDS <= set(response), RESPONSE_FIELDS - set(response)
    for item in response["output"]:
        check_item(item)


def stream_of(
    fmt: OpenAIResponses, ctx: ProtocolContext, events: list[Event], **body: Any
) -> list[dict[str, Any]]:
    """Every frame checked: the SDK's types, Open Responses' required fields, `[DONE]` last."""
    job = fmt.parse(orjson.dumps({"model": "m", "stream": True, **body}), ctx)
    frames = sse_events(render_stream(fmt, job, ctx, events))
    assert frames.pop() == (None, "[DONE]")
    out = []
    for name, data in frames:
        assert name == data["type"] and isinstance(data["sequence_number"], int)
        assert EVENT_FIELDS[name] <= set(data), (name, data)
        STREAM_EVENT.validate_python(data)
        if "response" in data:
            check_response(data["response"])
        if "item" in data:
            check_item(data["item"])
        out.append(data)
    return out


def answer(fmt: OpenAIResponses, ctx: ProtocolContext, events: list[Event], **fields: Any) -> dict[str, Any]:
    job = parse(fmt, ctx, **fields)
    body: dict[str, Any] = orjson.loads(render_json(fmt, job, ctx, events))
    Response.model_validate(body)
    check_response(body)
    return body


def call(name: str, args: str, index: int = 0, call_id: str = "call_1") -> list[Event]:
    return [ToolCallStart(index, call_id, name), ToolCallArgsDelta(index, args)]


# --- Codex's request as it comes ----------------------------------------------------------------


def test_codex_request_is_served(fmt: OpenAIResponses, long_ctx: ProtocolContext) -> None:
    job = fmt.parse(orjson.dumps(codex_request()), long_ctx)
    call_ = rendered(long_ctx)
    assert call_.messages[0] == {"role": "system", "content": "rules"}
    names = [t["function"]["name"] for t in call_.tools]
    assert names == ["exec_command", "multi_agent_v1__spawn_agent", "multi_agent_v1__wait_agent"]
    assert call_.tools[1]["function"]["description"] == "Sub-agents.\n\nStart one"
    [note] = job.warnings
    assert note.startswith('299 - "') and "'web_search'" in note
    # No max_output_tokens: the answer may run to the context that remains.
    assert job.request.max_tokens == 4096 - len(job.request.prompt_tokens)
    assert (job.store, job.keep_reasoning) == (False, True)


def test_max_output_tokens_still_limits(fmt: OpenAIResponses, long_ctx: ProtocolContext) -> None:
    assert parse(fmt, long_ctx, input="hi", max_output_tokens=9).request.max_tokens == 9


def test_codex_request_echoes_tools_it_offered(fmt: OpenAIResponses, long_ctx: ProtocolContext) -> None:
    final = stream_of(
        fmt, long_ctx, [TextDelta("Hi"), Finished(FinishReason.STOP, Usage(9, 1))], **codex_request()
    )
    response = final[-1]["response"]
    assert [t["type"] for t in response["tools"]] == ["function", "namespace"]
    assert response["prompt_cache_key"] == "thread-1" and response["store"] is False


# --- namespaces ---------------------------------------------------------------------------------


def test_a_namespaced_call_comes_back_under_its_name_and_namespace(
    fmt: OpenAIResponses, ctx: ProtocolContext
) -> None:
    events = [
        *call("multi_agent_v1__wait_agent", '{"targets": []}'),
        Finished(FinishReason.TOOL_CALLS, Usage(9, 4)),
    ]
    body = answer(fmt, ctx, events, input="wait", tools=[AGENTS])
    [item] = body["output"]
    assert (item["type"], item["name"], item["namespace"]) == (
        "function_call",
        "wait_agent",
        "multi_agent_v1",
    )
    frames = stream_of(fmt, ctx, events, input="wait", tools=[AGENTS])
    added = next(f for f in frames if f["type"] == "response.output_item.added")["item"]
    assert (added["name"], added["namespace"]) == ("wait_agent", "multi_agent_v1")


def test_a_replayed_namespaced_call_is_the_flattened_name_again(
    fmt: OpenAIResponses, ctx: ProtocolContext
) -> None:
    replay = [
        {"role": "user", "content": "wait"},
        {
            "type": "function_call",
            "id": "fc_1",
            "name": "wait_agent",
            "namespace": "multi_agent_v1",
            "arguments": "{}",
            "call_id": "call_1",
        },
        {"type": "function_call_output", "id": "fco_1", "call_id": "call_1", "output": "no agents"},
    ]
    parse(fmt, ctx, input=replay, tools=[AGENTS])
    turn = rendered(ctx).messages[1]
    assert turn["tool_calls"][0]["function"]["name"] == "multi_agent_v1__wait_agent"


def test_a_namespace_ending_in_underscore_is_joined_as_is(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    mcp = {**AGENTS, "name": "mcp__docs__"}
    parse(fmt, ctx, input="hi", tools=[mcp])
    assert [t["function"]["name"] for t in rendered(ctx).tools] == [
        "mcp__docs__spawn_agent",
        "mcp__docs__wait_agent",
    ]


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "computer_use_preview", "display_width": 1, "display_height": 1, "environment": "linux"},
        {"type": "image_generation"},
        {"type": "mcp", "server_label": "x", "server_url": "http://x"},
        {"type": "tool_search", "execution": "client", "parameters": {}},
        {"type": "web_search_preview"},
    ],
)
def test_hosted_tools_are_left_out_with_a_warning(
    fmt: OpenAIResponses, ctx: ProtocolContext, tool: Any
) -> None:
    job = parse(fmt, ctx, input="hi", tools=[EXEC, tool])
    assert [t["function"]["name"] for t in rendered(ctx).tools] == ["exec_command"]
    [note] = job.warnings
    assert repr(tool["type"]) in note


def test_a_deferred_function_waits_for_tool_search(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    parse(fmt, ctx, input="hi", tools=[EXEC, {**EXEC, "name": "later", "defer_loading": True}])
    assert [t["function"]["name"] for t in rendered(ctx).tools] == ["exec_command"]


# --- custom (freeform) tools ----------------------------------------------------------------------


PATCH_TEXT = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"
PATCH_CALL: list[Event] = [
    TextDelta("Patching."),
    *call("apply_patch", orjson.dumps({"input": PATCH_TEXT}).decode()),
    Finished(FinishReason.TOOL_CALLS, Usage(9, 30)),
]


def test_a_custom_tool_is_a_function_of_one_string(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    parse(fmt, ctx, input="patch it", tools=[PATCH])
    [tool] = rendered(ctx).tools
    function = tool["function"]
    assert function["name"] == "apply_patch"
    assert function["parameters"]["properties"]["input"]["type"] == "string"
    assert function["description"] == (
        "Edit files.\n\nThe input must follow this lark grammar:\nstart: begin_patch hunk+ end_patch"
    )


def test_a_custom_tool_call_is_a_custom_tool_call_item(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    body = answer(fmt, ctx, PATCH_CALL, input="patch it", tools=[PATCH])
    item = body["output"][1]
    assert (item["type"], item["name"], item["input"], item["call_id"]) == (
        "custom_tool_call",
        "apply_patch",
        PATCH_TEXT,
        "call_1",
    )
    assert item["id"].startswith("ctc_")


def test_a_custom_tool_call_streams_its_input(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    frames = stream_of(fmt, ctx, PATCH_CALL, input="patch it", tools=[PATCH])
    kinds = [f["type"] for f in frames]
    assert "response.function_call_arguments.delta" not in kinds
    delta = next(f for f in frames if f["type"] == "response.custom_tool_call_input.delta")
    done = next(f for f in frames if f["type"] == "response.custom_tool_call_input.done")
    assert delta["delta"] == done["input"] == PATCH_TEXT
    assert frames[-1]["response"]["output"][1]["input"] == PATCH_TEXT


def test_a_replayed_custom_call_and_output(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    replay = [
        {"role": "user", "content": "patch it"},
        {
            "type": "custom_tool_call",
            "id": "ctc_1",
            "call_id": "call_1",
            "name": "apply_patch",
            "input": PATCH_TEXT,
        },
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Success."},
    ]
    parse(fmt, ctx, input=replay, tools=[PATCH])
    assistant, result = rendered(ctx).messages[1:]
    assert assistant["tool_calls"][0]["function"] == {
        "name": "apply_patch",
        "arguments": {"input": PATCH_TEXT},
    }
    assert result == {"role": "tool", "content": "Success.", "tool_call_id": "call_1"}


def test_custom_tool_choice_forces_that_tool(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    job = parse(
        fmt, ctx, input="hi", tools=[EXEC, PATCH], tool_choice={"type": "custom", "name": "apply_patch"}
    )
    tools = rendered(ctx).tools
    assert job.request.grammar == structured.forced_calls(tools, "apply_patch", False, False)


# --- reasoning kept for store: false clients -------------------------------------------------------


def test_reasoning_comes_back_in_encrypted_content_and_is_read_back(
    fmt: OpenAIResponses, ctx: ProtocolContext
) -> None:
    events = [ReasoningDelta("think"), TextDelta("Hi"), Finished(FinishReason.STOP, Usage(9, 2))]
    body = answer(fmt, ctx, events, input="hi", include=["reasoning.encrypted_content"], store=False)
    reasoning = body["output"][0]
    assert unwrap(reasoning["encrypted_content"]) == "think"
    replay = [
        {"role": "user", "content": "hi"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": None,
            "encrypted_content": reasoning["encrypted_content"],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]},
        {"role": "user", "content": "more"},
    ]
    parse(fmt, ctx, input=replay)
    assert rendered(ctx).messages[1]["reasoning_content"] == "think"


def test_reasoning_without_include_has_no_encrypted_content(
    fmt: OpenAIResponses, ctx: ProtocolContext
) -> None:
    events = [ReasoningDelta("think"), Finished(FinishReason.STOP, Usage(9, 1))]
    assert "encrypted_content" not in answer(fmt, ctx, events, input="hi")["output"][0]


def test_foreign_encrypted_reasoning_is_redacted(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    replay = [
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "summary": [], "encrypted_content": "gAAAA-openai-blob"},
        {"role": "assistant", "content": "Hi"},
        {"role": "user", "content": "more"},
    ]
    parse(fmt, ctx, input=replay)
    assert "reasoning_content" not in rendered(ctx).messages[1]


# --- compaction -------------------------------------------------------------------------------


def test_compact_summarises_and_keeps_the_users_messages(
    fmt: OpenAIResponses, long_ctx: ProtocolContext
) -> None:
    history = [
        {"role": "user", "content": "fix the bug"},
        {"role": "assistant", "content": "Done: edited a.py"},
        {"role": "user", "content": [{"type": "input_text", "text": "and test it"}]},
    ]
    job = fmt.compact_job(orjson.dumps({"model": "m", "input": history}), long_ctx)
    asked = rendered(long_ctx).messages
    assert asked[-1] == {"role": "user", "content": f"and test it\n\n{COMPACTION_PROMPT}"}
    assert job.request.max_tokens == 256  # the server's --max-tokens: a summary is short
    body = orjson.loads(
        fmt.compacted(job, Result(" The user wants a fix. ", FinishReason.STOP, Usage(40, 6)), long_ctx)
    )
    # The SDK's CompactedResponse types its output as output items, which the user messages it
    # documents ("all user messages, followed by a single compaction item") are not: checked by hand.
    assert (
        set(body) == {"id", "object", "output", "created_at", "usage"}
        and body["object"] == "response.compaction"
    )
    ResponseUsage.model_validate(body["usage"])
    users, last = body["output"][:-1], body["output"][-1]
    assert [u["content"][0]["text"] for u in users] == ["fix the bug", "and test it"]
    assert last["type"] == "compaction" and unwrap(last["encrypted_content"]) == "The user wants a fix."
    # The window goes back as the next request's input.
    parse(fmt, long_ctx, input=[*body["output"], {"role": "user", "content": "next"}])
    assert (
        rendered(long_ctx)
        .messages[-1]["content"]
        .startswith("fix the bug\n\nand test it\n\n" + SUMMARY_HEADING)
    )


def test_compact_instructions_replace_the_prompt(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    fmt.compact_job(orjson.dumps({"model": "m", "input": "hi", "instructions": "Keep the goals."}), ctx)
    assert rendered(ctx).messages[-1]["content"] == "hi\n\nKeep the goals."


def test_compact_needs_a_model(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    with pytest.raises(InvalidRequest) as info:
        fmt.compact_job(orjson.dumps({"input": "hi"}), ctx)
    assert (info.value.status, info.value.param) == (400, "model")


def test_a_foreign_compaction_item_is_refused_by_name(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(fmt, ctx, input=[{"type": "compaction", "encrypted_content": "opaque-from-elsewhere"}])
    assert info.value.param == "input[0].encrypted_content"
    parse(fmt, ctx, input=[{"type": "compaction", "id": "cmp_1", "encrypted_content": opaque("summary")}])
    assert rendered(ctx).messages[-1]["content"] == f"{SUMMARY_HEADING}\nsummary"


# --- item references, allowed_tools, penalties ------------------------------------------------------


def test_an_item_reference_is_the_stored_item(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    events = [*call("exec_command", '{"cmd": "ls"}'), Finished(FinishReason.TOOL_CALLS, Usage(9, 3))]
    made = answer(fmt, ctx, events, input="list", tools=[EXEC])
    ref = made["output"][0]["id"]
    parse(
        fmt,
        ctx,
        input=[
            {"role": "user", "content": "list"},
            {"id": ref},
            {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
        ],
        tools=[EXEC],
    )
    assert rendered(ctx).messages[1]["tool_calls"][0]["function"]["name"] == "exec_command"
    with pytest.raises(NotFound) as info:
        parse(fmt, ctx, input=[{"type": "item_reference", "id": "fc_missing"}])
    assert info.value.param == "input[0].id"


def test_allowed_tools_required_forces_a_call_among_them(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    choice = {
        "type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "exec_command"}],
    }
    job = parse(fmt, ctx, input="hi", tools=[EXEC, PATCH], tool_choice=choice)
    every = rendered(ctx).tools
    assert len(every) == 2  # every tool stays in the prompt
    assert job.request.grammar == structured.forced_calls(every[:1], None, True, True)
    assert job.request.forced_tool_calls


def test_allowed_tools_auto_permits_text_or_calls_among_them(
    fmt: OpenAIResponses, ctx: ProtocolContext
) -> None:
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "custom", "name": "apply_patch"}]}
    job = parse(fmt, ctx, input="hi", tools=[EXEC, PATCH], tool_choice=choice)
    assert job.request.grammar == structured.allowed_calls(rendered(ctx).tools[1:], True)


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        (
            {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "nope"}]},
            "tool_choice.tools[0]",
        ),
        ({"type": "allowed_tools", "mode": "sometimes", "tools": []}, "tool_choice"),
        ({"type": "web_search_preview"}, "tool_choice.type"),
        ("always", "tool_choice"),
    ],
)
def test_bad_tool_choices_are_400s_naming_the_field(
    fmt: OpenAIResponses, ctx: ProtocolContext, choice: Any, param: str
) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(fmt, ctx, input="hi", tools=[EXEC], tool_choice=choice)
    assert info.value.param == param


def test_penalties_reach_the_sampler_and_the_echo(fmt: OpenAIResponses, ctx: ProtocolContext) -> None:
    job = parse(fmt, ctx, input="hi", presence_penalty=0.5, frequency_penalty=-0.25, safety_identifier="u1")
    assert (job.request.sampling.presence_penalty, job.request.sampling.frequency_penalty) == (0.5, -0.25)
    assert (job.echo["presence_penalty"], job.echo["frequency_penalty"]) == (0.5, -0.25)
    assert job.echo["safety_identifier"] == "u1"


def test_an_error_mid_stream_is_an_error_event_then_response_failed(
    fmt: OpenAIResponses, ctx: ProtocolContext
) -> None:
    job = parse(fmt, ctx, input="hi", stream=True)
    frames = sse_events(render_stream(fmt, job, ctx, [TextDelta("pa")], EngineFailed("boom")))
    assert [n for n, _ in frames[-3:]] == ["error", "response.failed", None]
    _name, event = frames[-3]
    assert EVENT_FIELDS["error"] <= set(event) and event["error"]["message"] == "boom"
    check_response(frames[-2][1]["response"])


# --- the SDK as client ------------------------------------------------------------------------


@pytest.fixture
def server(fmt: OpenAIResponses, ctx: ProtocolContext) -> ScriptedServer:
    srv = ScriptedServer(fmt, ctx, "/v1/responses")
    srv.routes[("POST", "/v1/responses/compact")] = lambda r: (
        200,
        fmt.compacted(
            fmt.compact_job(r.content, ctx), Result("summary", FinishReason.STOP, Usage(9, 1)), ctx
        ),
    )
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


def test_sdk_streams_a_codex_turn_with_a_namespaced_call(
    client: openai.OpenAI, server: ScriptedServer
) -> None:
    server.events = [
        *call("multi_agent_v1__spawn_agent", '{"message": "go"}'),
        Finished(FinishReason.TOOL_CALLS, Usage(9, 4)),
    ]
    body = codex_request()
    del body["stream"]
    extra = {"client_metadata": body.pop("client_metadata")}
    with client.responses.stream(**body, extra_body=extra) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed"
    [item] = final.output
    assert item.type == "function_call" and (item.name, item.namespace) == ("spawn_agent", "multi_agent_v1")


def test_sdk_sees_the_hosted_tool_warning(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response.create(model="m", input="hi", tools=[EXEC, WEB_SEARCH])
    assert "'web_search'" in raw.headers["warning"]
    assert raw.parse().status == "completed"


def test_sdk_compact(server: ScriptedServer) -> None:
    # Not strict: the SDK's types do not admit the user messages of a compacted window.
    with httpx2.Client(transport=server.transport()) as http:
        client = openai.OpenAI(api_key="k", base_url="http://mlx-serve/v1", http_client=http, max_retries=0)
        compacted = client.responses.compact(model="gpt-5.5", input="hi")
    assert compacted.object == "response.compaction"
    assert [o.type for o in compacted.output] == ["message", "compaction"]
