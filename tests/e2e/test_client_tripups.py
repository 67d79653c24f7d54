"""Tier 3: what real clients tripped on, each through the client's own SDK.

Claude Code sizes its context window from the Anthropic models list; instructor's tools modes
send a forced tool with a structured output format; the OpenAI SDK reads `code` on a 404.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.support.server_proc import ServerProcess

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CITY = {
    "type": "function",
    "function": {
        "name": "capital",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def oai(smollm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def claude(smollm_server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=smollm_server.url, api_key="unused", max_retries=0)


def test_the_anthropic_models_list_carries_the_window_claude_code_reads(
    claude: anthropic.Anthropic, oai: openai.OpenAI
) -> None:
    models = list(claude.models.list())
    window = oai.models.list().data[0].model_extra["context_length"]  # type: ignore[index]
    assert models and all(m.max_input_tokens == m.max_tokens == window for m in models)
    assert all(m.lifecycle == "active" for m in models) and isinstance(window, int) and window > 0


def test_an_unknown_model_is_model_not_found_for_the_openai_sdk(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        oai.models.retrieve("gpt-4o")
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError) as info:
        oai.chat.completions.create(model="gpt-4o", messages=QUESTION, max_tokens=4)  # type: ignore[arg-type]
    assert info.value.code == "model_not_found"


def test_count_tokens_refuses_the_model_messages_refuses(claude: anthropic.Anthropic) -> None:
    counted = claude.messages.count_tokens(model="claude-x", messages=QUESTION)  # type: ignore[arg-type]
    assert counted.input_tokens > 0
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.count_tokens(model="gpt-4o", messages=QUESTION)  # type: ignore[arg-type]


def test_a_chat_without_max_tokens_is_told_the_servers_limit(oai: openai.OpenAI) -> None:
    raw = oai.chat.completions.with_raw_response.create(model="m", messages=QUESTION)  # type: ignore[arg-type]
    assert "--max-tokens" in raw.headers["warning"] and "512" in raw.headers["warning"]
    raw = oai.chat.completions.with_raw_response.create(model="m", messages=QUESTION, max_tokens=8)  # type: ignore[arg-type]
    assert "warning" not in raw.headers


def test_a_forced_tool_with_a_json_format_calls_the_tool_as_instructor_expects(oai: openai.OpenAI) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model="m",
        messages=QUESTION,  # type: ignore[arg-type]
        tools=[CITY],  # type: ignore[list-item]
        tool_choice={"type": "function", "function": {"name": "capital"}},
        response_format={"type": "json_object"},
        max_tokens=40,
    )
    calls = raw.parse().choices[0].message.tool_calls
    assert calls and calls[0].function.name == "capital" and "city" in calls[0].function.arguments  # type: ignore[union-attr]
    assert "`response_format` did not apply" in raw.headers["warning"]


def test_an_effort_smollm_cannot_take_is_served_with_a_warning(oai: openai.OpenAI) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model="m",
        messages=QUESTION,  # type: ignore[arg-type]
        max_tokens=8,
        reasoning_effort="high",
    )
    assert "`reasoning_effort` has no effect" in raw.headers["warning"]
