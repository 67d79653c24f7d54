"""Tier 3: what Claude Code, Codex, llama.cpp and legacy-completions clients send, through the
official SDKs against the real default model: context management, tools on a template
without tool support, Codex's tool kinds, Open Responses compaction and output limits, prompt
arrays, llama.cpp's grammar fields."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest

from tests.support.server_proc import ServerProcess

BASH: Any = {
    "name": "Bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
EXEC: Any = {"type": "function", "name": "exec_command", "description": "Runs a command", "strict": False,
             "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}  # fmt: skip
AGENTS: Any = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
               "tools": [{"type": "function", "name": "wait_agent", "description": "Wait", "parameters": {}}]}  # fmt: skip


@pytest.fixture(scope="module")
def claude(smollm_server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=smollm_server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def oai(smollm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0)


def tool_loop(n: int) -> list[Any]:
    out: list[Any] = [{"role": "user", "content": "List the files."}]
    for i in range(n):
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": "ls"}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"file_{i}.txt\n" * 30}
        out += [{"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    return [*out, {"role": "user", "content": "Thanks. Say done."}]


# --- Anthropic: what Claude Code sends ---------------------------------------------------------


def test_a_claude_code_shaped_request_is_answered(claude: anthropic.Anthropic) -> None:
    with claude.beta.messages.stream(
        model="claude-x",
        max_tokens=32000,  # clamped to the context that remains
        system=[
            {"type": "text", "text": "You are a helpful assistant.", "cache_control": {"type": "ephemeral"}}
        ],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},  # type: ignore[list-item]
        ],
        thinking={"type": "adaptive", "display": "updates"},  # type: ignore[typeddict-item]
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        output_config={"effort": "high"},
        metadata={"user_id": json.dumps({"device_id": "d", "session_id": "s"})},
        betas=["context-management-2025-06-27", "effort-2025-11-24"],
    ) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "end_turn" and message.content[-1].type == "text"
    assert message.context_management is not None and message.context_management.applied_edits == []


def test_clear_tool_uses_frees_what_count_tokens_measures(claude: anthropic.Anthropic) -> None:
    edit: Any = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 1},
                            "keep": {"type": "tool_uses", "value": 1}}]}  # fmt: skip
    counted = claude.beta.messages.count_tokens(
        model="claude-x", messages=tool_loop(3), tools=[BASH], context_management=edit
    )
    full = claude.messages.count_tokens(model="claude-x", messages=tool_loop(3), tools=[BASH])
    assert counted.context_management is not None
    assert counted.context_management.original_input_tokens == full.input_tokens
    message = claude.beta.messages.create(
        model="claude-x", max_tokens=8, messages=tool_loop(3), tools=[BASH], context_management=edit
    )
    assert message.context_management is not None
    [applied] = message.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919" and applied.cleared_tool_uses == 2
    assert applied.cleared_input_tokens == full.input_tokens - counted.input_tokens > 0
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == counted.input_tokens


def test_tools_on_a_template_without_tool_support(claude: anthropic.Anthropic) -> None:
    ask: Any = [{"role": "user", "content": "What's in this folder?"}]
    raw = claude.messages.with_raw_response.create(model="claude-x", max_tokens=8, messages=ask, tools=[BASH])
    assert "no tool support" in raw.headers["warning"]
    with_tools = claude.messages.count_tokens(model="claude-x", messages=ask, tools=[BASH]).input_tokens
    without = claude.messages.count_tokens(model="claude-x", messages=ask).input_tokens
    assert with_tools > without + 20  # the tools are described to the model, not dropped


def test_server_tools_are_left_out_with_a_warning(claude: anthropic.Anthropic) -> None:
    raw = claude.messages.with_raw_response.create(
        model="claude-x", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "web_search_20250305", "name": "web_search"}],
    )  # fmt: skip
    assert "'web_search' (web_search_20250305)" in raw.headers["warning"]
    assert raw.parse().stop_reason in ("end_turn", "max_tokens")


# --- Responses: what Codex sends; Open Responses --------------------------------------------------


def test_a_codex_shaped_request_runs_to_its_end(oai: openai.OpenAI) -> None:
    raw = oai.responses.with_raw_response.create(
        model="m",
        input=[{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
               {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}],
        tools=[EXEC, AGENTS, {"type": "web_search", "external_web_access": False}],
        store=False,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="thread-1",
        reasoning={"summary": "auto"},
        extra_body={"client_metadata": {"turn_id": "t"}},
    )  # fmt: skip
    assert "'web_search'" in raw.headers["warning"]
    response = raw.parse()
    # No max_output_tokens: the answer ran to its own end, not to --max-tokens.
    assert response.status == "completed" and response.max_output_tokens is None
    body = response.model_dump()
    for field in ("presence_penalty", "frequency_penalty", "safety_identifier", "prompt_cache_key"):
        assert field in body
    assert body["prompt_cache_key"] == "thread-1"


def test_a_stream_ends_with_response_completed_and_done(smollm_server: ServerProcess) -> None:
    import httpx

    body = {"model": "m", "input": "Say hi.", "stream": True, "max_output_tokens": 8}
    with httpx.stream("POST", smollm_server.url + "/v1/responses", json=body, timeout=120) as r:
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    final = json.loads(data[-2])
    assert final["type"] == "response.incomplete" or final["type"] == "response.completed"


def test_compact_then_continue_from_the_window(oai: openai.OpenAI) -> None:
    turns: Any = [{"role": "user", "content": "My name is Ada."},
                  {"role": "assistant", "content": "Nice to meet you, Ada."},
                  {"role": "user", "content": "I like tea."}]  # fmt: skip
    raw = oai.responses.with_raw_response.compact(model="m", input=turns)
    compacted = raw.parse()
    assert compacted.object == "response.compaction"
    # The window as sent (the SDK's types do not admit its user messages).
    window = raw.http_response.json()["output"]
    assert [(o["type"], o.get("role")) for o in window] == [
        ("message", "user"),
        ("message", "user"),
        ("compaction", None),
    ]
    follow = oai.responses.create(
        model="m", input=[*window, {"role": "user", "content": "Say ok."}], max_output_tokens=8
    )
    assert follow.status in ("completed", "incomplete") and follow.output_text


# --- legacy completions and llama.cpp fields ---------------------------------------------------


def test_a_prompt_array_answers_each_prompt_n_times(oai: openai.OpenAI) -> None:
    prompts = ["The capital of France is", "One, two, three,"]
    batch = oai.completions.create(model="m", prompt=prompts, n=2, max_tokens=6, temperature=0)
    alone = [oai.completions.create(model="m", prompt=p, max_tokens=6, temperature=0) for p in prompts]
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert [c.text for c in batch.choices] == [alone[0].choices[0].text] * 2 + [alone[1].choices[0].text] * 2
    assert batch.usage is not None and alone[0].usage is not None and alone[1].usage is not None
    assert batch.usage.prompt_tokens == alone[0].usage.prompt_tokens + alone[1].usage.prompt_tokens


def test_llama_cpp_grammar_and_json_schema(oai: openai.OpenAI) -> None:
    ask: Any = [{"role": "user", "content": "Is Paris in France?"}]
    yes_no = oai.chat.completions.create(model="m", messages=ask, max_tokens=5,
                                         extra_body={"grammar": 'root ::= "yes" | "no"'})  # fmt: skip
    assert yes_no.choices[0].message.content in ("yes", "no")
    schema = {"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"],
              "additionalProperties": False}  # fmt: skip
    shaped = oai.chat.completions.create(
        model="m", messages=ask, max_tokens=20, extra_body={"json_schema": schema}
    )
    assert isinstance(json.loads(shaped.choices[0].message.content or "")["answer"], bool)
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model="m", prompt="x", max_tokens=2, extra_body={"grammar": "root ::= nope"})
    assert info.value.param == "grammar"
