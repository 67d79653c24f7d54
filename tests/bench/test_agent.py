"""The agent benchmark's sessions, fixtures, and how it reads TTFT and cached tokens from a stream."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from bench.agent_client import TurnResult, carries_text, fold
from bench.agent_floor import common_prefix
from bench.agent_sessions import CHAT_ROUTE, build_session, read_fixture, templated_tokens
from bench.mixed import Stream, split_gaps


class WordTokenizer:
    """One token per whitespace-separated word; a message costs 3 more in the template."""

    def encode(self, text: str) -> list[int]:
        return [0] * len(text.split())

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> list[int]:
        return [0] * sum(3 + len(m["content"].split()) for m in messages)


def messages(body: dict[str, Any]) -> list[dict[str, str]]:
    return list(body["messages"])


def test_a_session_resends_the_whole_conversation_plus_the_new_tokens_each_turn() -> None:
    tok = WordTokenizer()
    session = build_session(tok, system_tokens=2000, turns=4, turn_tokens=400)
    assert len(session) == 4 and all(r.route == CHAT_ROUTE for r in session)
    sizes = [templated_tokens(tok, messages(r.body)) for r in session]
    system = messages(session[0].body)[0]
    assert system["role"] == "system" and 1900 <= len(tok.encode(system["content"])) <= 2001
    for before, after in itertools.pairwise(session):
        assert messages(after.body)[: len(messages(before.body))] == messages(before.body)
    growth = [b - a for a, b in itertools.pairwise(sizes)]
    assert all(390 <= g <= 400 for g in growth), growth
    assert all(r.body["stream"] and r.body["temperature"] == 0 for r in session)


def test_a_second_session_shares_the_system_prompt_under_another_first_line() -> None:
    tok = WordTokenizer()
    a = messages(build_session(tok, 500, 1, first_line="Session 1")[0].body)[0]["content"]
    b = messages(build_session(tok, 500, 1, first_line="Session 2")[0].body)[0]["content"]
    assert a.split("\n", 1)[0] != b.split("\n", 1)[0] and a.split("\n", 1)[1] == b.split("\n", 1)[1]
    again = messages(build_session(tok, 500, 1, first_line="Session 1")[0].body)[0]["content"]
    assert again == a


def test_a_fixture_is_replayed_streaming_on_its_own_routes(tmp_path: Path) -> None:
    path = tmp_path / "session.json"
    entries = [
        {"route": "/v1/messages", "body": {"model": "m", "max_tokens": 8, "messages": []}},
        {"body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}},
    ]
    path.write_text(json.dumps(entries))
    first, second = read_fixture(path)
    assert (
        first.route == "/v1/messages" and first.body["stream"] is True and "stream_options" not in first.body
    )
    assert second.route == CHAT_ROUTE and second.body["stream_options"] == {"include_usage": True}
    path.write_text(json.dumps({"route": "/v1/messages"}))
    with pytest.raises(ValueError, match="JSON list"):
        read_fixture(path)


def test_ttft_and_cached_tokens_are_read_from_openai_anthropic_and_responses_streams() -> None:
    openai = TurnResult()
    fold(openai, {"choices": [{"delta": {"role": "assistant", "content": ""}}]}, 0.1)
    fold(openai, {"choices": [{"delta": {"content": "Hi"}}]}, 0.5)
    fold(
        openai,
        {"choices": [], "usage": {"prompt_tokens": 900, "prompt_tokens_details": {"cached_tokens": 512}}},
        0.9,
    )
    assert (openai.ttft_s, openai.cached_tokens, openai.prompt_tokens) == (0.5, 512, 900)
    anthropic = TurnResult()
    start = {
        "type": "message_start",
        "message": {"usage": {"input_tokens": 88, "cache_read_input_tokens": 768}},
    }
    fold(anthropic, start, 0.2)
    fold(anthropic, {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "ok"}}, 0.3)
    assert (anthropic.ttft_s, anthropic.cached_tokens) == (0.3, 768)
    assert carries_text({"type": "response.output_text.delta", "delta": "x"})
    assert not carries_text({"type": "response.created", "response": {"output": []}})
    failed = TurnResult()
    fold(failed, {"error": {"message": "engine died"}}, 0.4)
    assert failed.error is not None and "engine died" in failed.error


def test_the_floor_prefills_only_what_a_turn_adds_to_the_last() -> None:
    assert common_prefix([1, 2, 3, 4], [1, 2, 3, 9, 9]) == 3
    assert common_prefix([], [1]) == 0 and common_prefix([1, 2], [1, 2, 3]) == 2


def test_mixed_splits_the_streams_gaps_at_the_long_prompts_send_and_first_token() -> None:
    stream = Stream(0.0, [1.0, 1.1, 1.2, 1.3, 2.5, 2.6])
    before, during = split_gaps([stream], sent=1.25, first=2.4)
    assert [round(g) for g in before] == [100, 100]
    assert [round(g) for g in during] == [100, 1200]  # 1.2-1.3 overlaps the send, 1.3-2.5 the prefill
