"""Claude Code's Messages requests: context management edits, tool search (deferred tools,
tool_reference), server tools left out with a Warning, and the beta fields, checked against the
anthropic SDK's beta types and its client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import orjson
import pydantic
import pytest
from anthropic.types.beta import BetaMessage, BetaRawMessageStreamEvent

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.types import Finished, FinishReason, TextDelta, Usage
from mlx_serve.protocols import anthropic_context, anthropic_messages
from mlx_serve.protocols.contract import Job, ProtocolContext, WireFormat
from tests.protocols.conftest import FakeTokenizer
from tests.protocols.scripted import ScriptedServer, render_json, render_stream, sse_events, text_events

FORMAT: WireFormat = anthropic_messages.FORMAT
STREAM_EVENT = pydantic.TypeAdapter(BetaRawMessageStreamEvent)
BASH: Any = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
        "additionalProperties": False,
    },
}
WEB_FETCH: Any = {
    "name": "WebFetch",
    "description": "Fetch a URL",
    "input_schema": {"type": "object", "properties": {"url": {"type": "string"}}},
    "defer_loading": True,
}
PLACEHOLDER: Any = {
    "name": "DeferredToolPlaceholder",
    "description": "x",
    "input_schema": {"type": "object", "properties": {}},
    "defer_loading": True,
}
KEEP_ALL: Any = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}


def parse(ctx: ProtocolContext, **fields: Any) -> Job:
    return FORMAT.parse(orjson.dumps({"model": "local-model", "max_tokens": 64, **fields}), ctx)


def rendered(ctx: ProtocolContext) -> Any:
    return ctx.tokenizer.chat_calls[-1]  # type: ignore[attr-defined]


def claude_code_request(**over: Any) -> dict[str, Any]:
    """The shape of Claude Code 2.1's first request for a non-Claude model name."""
    user = {
        "role": "user",
        "content": [
            {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
            {"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}},
        ],
    }
    body = {
        "model": "local-model",
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332"},
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            user,
            {"role": "system", "content": [{"type": "text", "text": "env: linux", "cache_control": {}}]},
        ],
        "tools": [BASH, PLACEHOLDER],
        "metadata": {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": "s"})},
        "thinking": {"type": "adaptive", "display": "updates"},
        "context_management": KEEP_ALL,
        "output_config": {"effort": "high"},
    }
    return {**body, **over}


def thinking_turns(n: int) -> list[Any]:
    """A conversation with `n` assistant turns, each thinking, then a last user question."""
    out: list[Any] = []
    for i in range(n):
        out.append({"role": "user", "content": f"q{i}"})
        blocks = [
            {"type": "thinking", "thinking": f"thought {i}", "signature": "s"},
            {"type": "text", "text": f"a{i}"},
        ]
        out.append({"role": "assistant", "content": blocks})
    return [*out, {"role": "user", "content": "last"}]


def tool_loop(n: int, name: str = "Bash") -> list[Any]:
    """`n` tool uses of `name`, each answered, then a user question."""
    out: list[Any] = [{"role": "user", "content": "go"}]
    for i in range(n):
        call_id = f"toolu_{name}_{i}"
        call = {"type": "tool_use", "id": call_id, "name": name, "input": {"command": f"echo {i}"}}
        out.append({"role": "assistant", "content": [call]})
        result = {"type": "tool_result", "tool_use_id": call_id, "content": f"output {i} " * 20}
        out.append({"role": "user", "content": [result]})
    return [*out, {"role": "user", "content": "done?"}]


def edits_of(job: Job) -> Any:
    return job.applied_edits  # type: ignore[attr-defined]


# --- Claude Code's request as it comes --------------------------------------------------------


def test_claude_code_request_is_served(ctx: ProtocolContext) -> None:
    job = FORMAT.parse(orjson.dumps(claude_code_request()), ctx)
    call = rendered(ctx)
    # Anthropic's order: the tools (in the empty leading system message the template writes them
    # into), the system prompt without the billing header, the conversation; the environment
    # stays a system turn after the user's.
    assert call.messages[:2] == [
        {"role": "system", "content": ""},
        {"role": "system", "content": "You are Claude Code."},
    ]
    assert [m["role"] for m in call.messages[2:]] == ["user", "system"]
    assert call.messages[-1]["content"] == "env: linux"
    assert [t["function"]["name"] for t in call.tools] == ["Bash"]  # the placeholder is deferred
    assert call.template_kwargs["enable_thinking"] is True
    assert edits_of(job) == ()
    assert job.request.max_tokens == 32000  # admission clamps it to the context, with a Warning


def test_claude_code_answer_reports_no_applied_edits(ctx: ProtocolContext) -> None:
    job = FORMAT.parse(orjson.dumps(claude_code_request(stream=False)), ctx)
    body = orjson.loads(render_json(FORMAT, job, ctx, text_events("Hi")))
    BetaMessage.model_validate(body)
    assert body["context_management"] == {"applied_edits": []}


def test_stream_message_delta_carries_context_management(ctx: ProtocolContext) -> None:
    job = FORMAT.parse(orjson.dumps(claude_code_request()), ctx)
    frames = sse_events(render_stream(FORMAT, job, ctx, text_events("Hi")))
    for name, data in frames:
        if name != "ping":
            STREAM_EVENT.validate_python(data)
    delta = next(d for n, d in frames if n == "message_delta")
    assert delta["context_management"] == {"applied_edits": []}


def test_without_context_management_the_answer_has_no_field(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=[{"role": "user", "content": "hi"}])
    body = orjson.loads(render_json(FORMAT, job, ctx, text_events("Hi")))
    assert "context_management" not in body


# --- clear_thinking_20251015 ------------------------------------------------------------------


def test_clear_thinking_keeps_the_last_turns_and_reports_what_went(ctx: ProtocolContext) -> None:
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]}
    job = parse(ctx, messages=thinking_turns(3), thinking={"type": "adaptive"}, context_management=edits)
    reasoning = [m.get("reasoning_content") for m in rendered(ctx).messages if m["role"] == "assistant"]
    assert reasoning == [None, None, "thought 2"]
    before = len(parse(ctx, messages=thinking_turns(3), context_management=KEEP_ALL).request.prompt_tokens)
    [applied] = edits_of(job)
    assert applied == {
        "type": "clear_thinking_20251015",
        "cleared_thinking_turns": 2,
        "cleared_input_tokens": before - len(job.request.prompt_tokens),
    }
    assert applied["cleared_input_tokens"] > 0


@pytest.mark.parametrize("keep", ["all", {"type": "all"}, {"type": "thinking_turns", "value": 5}])
def test_clear_thinking_keep_all_keeps_every_thought(ctx: ProtocolContext, keep: Any) -> None:
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": keep}]}
    job = parse(ctx, messages=thinking_turns(3), thinking={"type": "adaptive"}, context_management=edits)
    reasoning = [m.get("reasoning_content") for m in rendered(ctx).messages if m["role"] == "assistant"]
    assert reasoning == ["thought 0", "thought 1", "thought 2"]
    assert edits_of(job) == ()


def test_thinking_on_without_the_edit_keeps_only_the_last_turn(ctx: ProtocolContext) -> None:
    # Anthropic's default: as keep {"type": "thinking_turns", "value": 1}, reported nowhere.
    job = parse(ctx, messages=thinking_turns(2), thinking={"type": "enabled", "budget_tokens": 1024})
    reasoning = [m.get("reasoning_content") for m in rendered(ctx).messages if m["role"] == "assistant"]
    assert reasoning == [None, "thought 1"]
    assert edits_of(job) is None


def test_thinking_off_keeps_the_thoughts_it_is_sent(ctx: ProtocolContext) -> None:
    parse(ctx, messages=thinking_turns(2))
    reasoning = [m.get("reasoning_content") for m in rendered(ctx).messages if m["role"] == "assistant"]
    assert reasoning == ["thought 0", "thought 1"]


# --- clear_tool_uses_20250919 -----------------------------------------------------------------


def results_of(ctx: ProtocolContext) -> list[str]:
    return [m["content"] for m in rendered(ctx).messages if m["role"] == "tool"]


def clear_tool_uses(**edit: Any) -> Any:
    return {"edits": [{"type": "clear_tool_uses_20250919", **edit}]}


def test_clear_tool_uses_past_the_trigger_keeps_the_recent_results(ctx: ProtocolContext) -> None:
    full = parse(ctx, messages=tool_loop(5), tools=[BASH])
    edit = clear_tool_uses(
        trigger={"type": "input_tokens", "value": 10}, keep={"type": "tool_uses", "value": 2}
    )
    job = parse(ctx, messages=tool_loop(5), tools=[BASH], context_management=edit)
    cleared = anthropic_context.CLEARED_RESULT
    assert results_of(ctx) == [cleared, cleared, cleared, "output 3 " * 20, "output 4 " * 20]
    calls = [m["tool_calls"][0]["function"]["arguments"] for m in rendered(ctx).messages if "tool_calls" in m]
    assert calls[0] == {"command": "echo 0"}  # inputs stay unless clear_tool_inputs says so
    freed = len(full.request.prompt_tokens) - len(job.request.prompt_tokens)
    assert edits_of(job) == (
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3, "cleared_input_tokens": freed},
    )


def test_clear_tool_uses_below_the_trigger_changes_nothing(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=tool_loop(5), tools=[BASH], context_management=clear_tool_uses())
    assert anthropic_context.CLEARED_RESULT not in results_of(ctx)  # 100,000 tokens by default
    assert edits_of(job) == ()


def test_clear_tool_uses_triggered_by_tool_use_count(ctx: ProtocolContext) -> None:
    edit = clear_tool_uses(trigger={"type": "tool_uses", "value": 3}, keep={"type": "tool_uses", "value": 0})
    parse(ctx, messages=tool_loop(3), tools=[BASH], context_management=edit)
    assert anthropic_context.CLEARED_RESULT not in results_of(ctx)
    job = parse(ctx, messages=tool_loop(4), tools=[BASH], context_management=edit)
    assert results_of(ctx) == [anthropic_context.CLEARED_RESULT] * 4
    assert edits_of(job)[0]["cleared_tool_uses"] == 4


def test_clear_tool_uses_spares_excluded_tools_and_clears_inputs_when_asked(ctx: ProtocolContext) -> None:
    messages = tool_loop(2)[:-1] + tool_loop(1, "Read")[1:]
    edit = clear_tool_uses(
        trigger={"type": "tool_uses", "value": 0},
        keep={"type": "tool_uses", "value": 0},
        exclude_tools=["Read"],
        clear_tool_inputs=True,
    )
    parse(ctx, messages=messages, tools=[BASH, {**BASH, "name": "Read"}], context_management=edit)
    cleared = anthropic_context.CLEARED_RESULT
    assert results_of(ctx) == [cleared, cleared, "output 0 " * 20]
    calls = [m["tool_calls"][0]["function"] for m in rendered(ctx).messages if "tool_calls" in m]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("Bash", {}),
        ("Bash", {}),
        ("Read", {"command": "echo 0"}),
    ]


def test_clear_tool_uses_clears_nothing_below_clear_at_least(ctx: ProtocolContext) -> None:
    edit = clear_tool_uses(
        trigger={"type": "tool_uses", "value": 0},
        keep={"type": "tool_uses", "value": 0},
        clear_at_least={"type": "input_tokens", "value": 1_000_000},
    )
    job = parse(ctx, messages=tool_loop(3), tools=[BASH], context_management=edit)
    assert job.request.prompt_tokens == parse(ctx, messages=tool_loop(3), tools=[BASH]).request.prompt_tokens
    assert edits_of(job) == ()


# --- compact_20260112 -------------------------------------------------------------------------


def test_compaction_below_its_trigger_changes_nothing(ctx: ProtocolContext) -> None:
    job = parse(ctx, messages=tool_loop(1), context_management={"edits": [{"type": "compact_20260112"}]})
    assert edits_of(job) == ()


def test_compaction_past_its_trigger_is_refused_by_name(ctx: ProtocolContext) -> None:
    edits = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 5}}]}
    with pytest.raises(InvalidRequest) as info:
        parse(ctx, messages=tool_loop(1), context_management=edits)
    assert info.value.param == "context_management.edits[0]"
    assert "compact_20260112" in info.value.message


@pytest.mark.parametrize(
    ("management", "param"),
    [
        ({"edits": [{"type": "clear_everything"}]}, "context_management.edits[0].type"),
        (
            {"edits": [{"type": "clear_thinking_20251015", "keep": "some"}]},
            "context_management.edits[0].keep",
        ),
        (
            {"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}]},
            "context_management.edits[0].keep.value",
        ),
    ],
)
def test_malformed_edits_are_400s_naming_the_field(ctx: ProtocolContext, management: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        parse(ctx, messages=tool_loop(1), context_management=management)
    assert info.value.param == param


# --- tool search, server tools, examples ------------------------------------------------------


def test_a_tool_reference_loads_its_deferred_tool(ctx: ProtocolContext) -> None:
    search = {
        "type": "tool_use",
        "id": "toolu_s",
        "name": "ToolSearch",
        "input": {"query": "select:WebFetch"},
    }
    found = {
        "type": "tool_result",
        "tool_use_id": "toolu_s",
        "content": [{"type": "tool_reference", "tool_name": "WebFetch"}],
    }
    messages = [
        {"role": "user", "content": "fetch it"},
        {"role": "assistant", "content": [search]},
        {"role": "user", "content": [found]},
    ]
    parse(ctx, messages=messages, tools=[BASH, WEB_FETCH, PLACEHOLDER])
    assert [t["function"]["name"] for t in rendered(ctx).tools] == ["Bash", "WebFetch"]
    assert results_of(ctx) == ["Tool loaded: WebFetch"]


def test_server_tools_are_left_out_with_a_warning(ctx: ProtocolContext) -> None:
    tools = [BASH, {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]
    job = parse(ctx, messages=[{"role": "user", "content": "hi"}], tools=tools)
    assert [t["function"]["name"] for t in rendered(ctx).tools] == ["Bash"]
    [note] = job.warnings
    assert note.startswith('299 - "') and "'web_search' (web_search_20250305)" in note


def test_input_examples_join_the_description(ctx: ProtocolContext) -> None:
    tool = {**BASH, "input_examples": [{"command": "ls"}]}
    parse(ctx, messages=[{"role": "user", "content": "hi"}], tools=[tool])
    assert (
        rendered(ctx).tools[0]["function"]["description"]
        == 'Run a shell command\n\nExample inputs:\n{"command":"ls"}'
    )


def test_tools_on_a_template_without_tool_support_come_with_a_warning(
    tokenizer: FakeTokenizer, ctx: ProtocolContext
) -> None:
    tokenizer.supports_tools = False
    job = parse(ctx, messages=[{"role": "user", "content": "hi"}], tools=[BASH])
    assert any("has no tool support" in w for w in job.warnings)
    assert not parse(ctx, messages=[{"role": "user", "content": "hi"}]).warnings


def test_count_tokens_reports_the_count_before_context_management(ctx: ProtocolContext) -> None:
    edit = clear_tool_uses(trigger={"type": "tool_uses", "value": 0}, keep={"type": "tool_uses", "value": 0})
    body = {"model": "m", "messages": tool_loop(3), "tools": [BASH], "context_management": edit}
    status, out = anthropic_messages.count_tokens(orjson.dumps(body), ctx)
    counted = orjson.loads(out)
    plain = orjson.loads(
        anthropic_messages.count_tokens(orjson.dumps({**body, "context_management": None}), ctx)[1]
    )
    assert status == 200
    assert counted["context_management"] == {"original_input_tokens": plain["input_tokens"]}
    assert counted["input_tokens"] < plain["input_tokens"]


# --- the SDK's beta client ------------------------------------------------------------------


@pytest.fixture
def server(ctx: ProtocolContext) -> ScriptedServer:
    return ScriptedServer(FORMAT, ctx, "/v1/messages")


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


def test_sdk_beta_create_reads_applied_edits(client: anthropic.Anthropic, server: ScriptedServer) -> None:
    server.events = [TextDelta("ok"), Finished(FinishReason.STOP, Usage(30, 1))]
    edit = clear_tool_uses(trigger={"type": "tool_uses", "value": 0}, keep={"type": "tool_uses", "value": 1})
    message = client.beta.messages.create(
        model="local-model",
        max_tokens=64,
        messages=tool_loop(3),
        tools=[BASH],
        context_management=edit,
        betas=["context-management-2025-06-27"],
    )
    assert message.context_management is not None
    [applied] = message.context_management.applied_edits
    assert (applied.type, applied.cleared_tool_uses) == ("clear_tool_uses_20250919", 2)


def test_sdk_beta_stream_of_a_claude_code_request(
    client: anthropic.Anthropic, server: ScriptedServer
) -> None:
    body = claude_code_request()
    del body["stream"]
    with client.beta.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello!"
    assert final.stop_reason == "end_turn"


def test_sdk_sees_the_server_tool_warning(client: anthropic.Anthropic) -> None:
    raw = client.messages.with_raw_response.create(
        model="m",
        max_tokens=8,
        messages=[{"role": "user", "content": "hi"}],
        tools=[BASH, {"type": "web_fetch_20250910", "name": "web_fetch"}],  # type: ignore[list-item]
    )
    assert "web_fetch" in raw.headers["warning"]
    assert raw.parse().content[0].type == "text"
