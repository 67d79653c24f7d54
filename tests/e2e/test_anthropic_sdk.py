"""Tier 3: the official anthropic SDK against a real Hypercorn serving the real default model.

Every answer is compared with the OpenAI chat endpoint's for the same conversation: the same
greedy text and the same usage (Anthropic's input_tokens + cache_read_input_tokens is the
chat endpoint's prompt_tokens).
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from tests.support.server_proc import ServerProcess, assert_disconnect_stops_generation

QUESTION: Any = [{"role": "user", "content": "What is the capital of France?"}]
STORY: Any = [{"role": "user", "content": "Write a very long story about a dragon who learns to cook."}]
SYSTEM = "You are a geography teacher. Answer in one sentence."
WEATHER: Any = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CHAT_WEATHER: Any = {
    "type": "function",
    "function": {
        "name": WEATHER["name"],
        "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"],
    },
}


@pytest.fixture(scope="module")
def client(smollm_server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=smollm_server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def chat(smollm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0)


def text_of(message: anthropic.types.Message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def prompt_tokens(usage: anthropic.types.Usage) -> int:
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_create_matches_the_chat_endpoint(client: anthropic.Anthropic, chat: openai.OpenAI) -> None:
    m = client.messages.create(model="claude-x", max_tokens=30, messages=QUESTION)
    c = chat.chat.completions.create(model="m", max_tokens=30, messages=QUESTION)
    assert "Paris" in text_of(m) and text_of(m) == c.choices[0].message.content
    assert (m.stop_reason, c.choices[0].finish_reason) == ("end_turn", "stop")
    assert m.id.startswith("msg_") and m.model == "claude-x" and m.role == "assistant"
    assert c.usage is not None
    assert prompt_tokens(m.usage) == c.usage.prompt_tokens
    assert m.usage.output_tokens == c.usage.completion_tokens


def test_stream_final_message_equals_create(client: anthropic.Anthropic, chat: openai.OpenAI) -> None:
    whole = client.messages.create(model="m", max_tokens=48, messages=STORY)
    kinds: list[str] = []
    with client.messages.stream(model="m", max_tokens=48, messages=STORY) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_message()
    assert text_of(final) == text_of(whole) and final.stop_reason == whole.stop_reason == "max_tokens"
    assert final.usage.output_tokens == whole.usage.output_tokens == 48
    assert prompt_tokens(final.usage) == prompt_tokens(whole.usage)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1


def test_system_and_multi_turn_match_chat(client: anthropic.Anthropic, chat: openai.OpenAI) -> None:
    turns: Any = [
        *QUESTION,
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ]
    m = client.messages.create(model="m", max_tokens=20, system=SYSTEM, messages=turns)
    c = chat.chat.completions.create(
        model="m", max_tokens=20, messages=[{"role": "system", "content": SYSTEM}, *turns]
    )
    assert text_of(m) == c.choices[0].message.content
    assert c.usage is not None and prompt_tokens(m.usage) == c.usage.prompt_tokens
    # A system message inside `messages` (recent Claude Code) joins the system prompt.
    inline = client.messages.create(
        model="m", max_tokens=20, messages=[{"role": "system", "content": SYSTEM}, *turns]
    )
    assert prompt_tokens(inline.usage) == c.usage.prompt_tokens


def test_count_tokens_equals_chat_prompt_tokens(client: anthropic.Anthropic, chat: openai.OpenAI) -> None:
    count = client.messages.count_tokens(model="m", system=SYSTEM, messages=QUESTION)
    c = chat.chat.completions.create(
        model="m", max_tokens=1, messages=[{"role": "system", "content": SYSTEM}, *QUESTION]
    )
    assert c.usage is not None and count.input_tokens == c.usage.prompt_tokens


def test_tool_round_trip_in_the_input_matches_chat(client: anthropic.Anthropic, chat: openai.OpenAI) -> None:
    ask = {"role": "user", "content": "What is the weather in Paris? Use the tool."}
    m = client.messages.create(
        model="m",
        max_tokens=30,
        tools=[WEATHER],
        messages=[
            ask,
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 24 C"}],
            },
        ],
    )
    c = chat.chat.completions.create(
        model="m",
        max_tokens=30,
        tools=[CHAT_WEATHER],
        messages=[
            ask,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny, 24 C"},
        ],
    )
    assert c.usage is not None and prompt_tokens(m.usage) == c.usage.prompt_tokens
    assert text_of(m) == (c.choices[0].message.content or "")


def test_tool_prompt_answers_in_the_wire_shape(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model="m",
        max_tokens=60,
        tools=[WEATHER],
        tool_choice={"type": "auto"},
        messages=[{"role": "user", "content": "Call get_weather for Paris."}],
    )
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert {b.type for b in m.content} <= {"text", "tool_use", "thinking"}
    for block in m.content:
        if block.type == "tool_use":
            assert block.id.startswith("toolu_") and isinstance(block.input, dict)


def test_errors_use_anthropic_envelope(client: anthropic.Anthropic, smollm_server: ServerProcess) -> None:
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model="m",
            max_tokens=10,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "url", "url": "http://example.com/cat.png"}}
                    ],
                }
            ],
        )
    assert e.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "this model has no vision input"},
    }
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model="m",
            max_tokens=10,
            messages=QUESTION,
            tool_choice={"type": "tool", "name": "nope"},
            tools=[WEATHER],
        )
    assert "not among the tools offered" in e.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(
            model="m",
            max_tokens=10,
            messages=QUESTION,
            stream=True,
            output_config={"format": {"type": "json_schema", "schema": {"type": "foo"}}},
        )
    assert e.value.body["error"]["message"] == "invalid JSON schema: Invalid type: foo"  # type: ignore[index]
    url = smollm_server.url + "/v1/messages"
    for body in (
        b"{",
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}',
        b'{"model": "m", "max_tokens": 5, "messages": []}',
    ):
        r = httpx.post(url, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, body
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(url + "/count_tokens", json={"model": "m", "messages": "hi"})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert client.messages.create(model="m", max_tokens=5, messages=QUESTION).content


def test_disconnect_mid_stream_stops_generation(smollm_server: ServerProcess) -> None:
    body = {"model": "m", "messages": STORY, "max_tokens": 2000, "stream": True}
    assert_disconnect_stops_generation(smollm_server, "/v1/messages", body, 12)


def test_the_sdks_tool_runner_runs_on_a_server_held_thread(
    client: anthropic.Anthropic, smollm_server: ServerProcess
) -> None:
    """tool_runner sends `thread: create`, then only each tool result with `thread: continue`."""
    cities: list[str] = []
    bodies: list[dict[str, Any]] = []

    @anthropic.beta_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: the city's name
        """
        cities.append(city)
        return f"Sunny in {city}."

    def seen(request: httpx2.Request) -> None:
        bodies.append(json.loads(request.content))

    watched = client.with_options(http_client=httpx2.Client(event_hooks={"request": [seen]}))
    runner = watched.beta.messages.tool_runner(
        model="m",
        max_tokens=40,
        max_iterations=2,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[get_weather],
        tool_choice={"type": "tool", "name": "get_weather"},  # SmolLM2 calls tools when made to
    )
    replies = list(runner)
    assert len(replies) == 2 and all(r.stop_reason == "tool_use" for r in replies)
    assert len(cities) == 2  # both turns' calls ran
    assert [b["thread"]["type"] for b in bodies] == ["create", "continue"]
    assert bodies[1]["thread"]["previous_message_id"] == replies[0].id
    # The second request carried only the tool result: the server held the rest.
    [only] = bodies[1]["messages"]
    assert only["role"] == "user" and only["content"][0]["type"] == "tool_result"
    assert "tools" not in bodies[1] and "system" not in bodies[1]
    held = replies[1].usage.input_tokens + (replies[1].usage.cache_read_input_tokens or 0)
    assert held > replies[0].usage.input_tokens + (replies[0].usage.cache_read_input_tokens or 0)


def test_cache_miss_diagnostics_name_what_changed_and_the_log_says_so(
    client: anthropic.Anthropic, smollm_server: ServerProcess
) -> None:
    first = client.beta.messages.create(
        model="m", max_tokens=4, system=SYSTEM, messages=QUESTION, diagnostics={"previous_message_id": None}
    )
    assert first.diagnostics is None  # nothing to compare with yet
    turn: Any = [
        *QUESTION,
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And Spain?"},
    ]
    second = client.beta.messages.create(
        model="m",
        max_tokens=4,
        system="You are a history teacher.",
        messages=turn,
        diagnostics={"previous_message_id": first.id},
        betas=["cache-diagnosis-2026-04-07"],
    )
    assert second.diagnostics is not None and second.diagnostics.cache_miss_reason is not None
    reason = second.diagnostics.cache_miss_reason
    assert reason.type == "system_changed" and reason.cache_missed_input_tokens > 0  # type: ignore[union-attr]
    [line] = [ln for ln in smollm_server.log().splitlines() if f"id={second.id} " in ln]
    assert "cache_miss_reason=system_changed" in line


def test_a_streamed_turns_message_start_reports_the_prompt_the_cache_served(
    client: anthropic.Anthropic,
) -> None:
    # Claude Code reads a turn's usage from message_start: a repeated long prompt (over a
    # prefix-cache block) must be reported there as read from the cache, not only at the end.
    long: Any = [{"role": "user", "content": "Name the rivers of Europe, one by one, with care. " * 60}]

    def streamed() -> tuple[anthropic.types.Usage, anthropic.types.Usage]:
        with client.messages.stream(model="claude-x", max_tokens=4, messages=long) as stream:
            start = next(e for e in stream if e.type == "message_start").message.usage
            return start, stream.get_final_message().usage

    streamed()
    start, final = streamed()
    assert start.cache_read_input_tokens is not None and start.cache_read_input_tokens > 256
    assert start.cache_read_input_tokens == final.cache_read_input_tokens  # the finish says the same
    assert start.input_tokens == final.input_tokens and prompt_tokens(start) == prompt_tokens(final)
