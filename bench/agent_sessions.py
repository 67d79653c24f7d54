"""Synthetic agent sessions, and recorded ones read back from a fixture file.

A coding agent sends a long system prompt (tools, rules, environment) and then, turn after
turn, the whole conversation again with a few hundred new tokens at its end (the model's last
reply, a tool result, the next ask). `build_session` writes such a session for a real
tokenizer: a system prompt of about `system_tokens` tokens whose first line names the session
(as an agent's per-session header does), then `turns` requests, each the previous one plus an
assistant reply and a user message, about `turn_tokens` templated tokens more. The text is
seeded, so the same arguments give the same session.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

CHAT_ROUTE = "/v1/chat/completions"
WORDS = (
    *("parse", "config", "request", "buffer", "index", "commit", "branch", "module", "test", "cache"),
    *("thread", "socket", "render", "schema", "token", "shard", "queue", "worker", "signal", "layer"),
    *("file", "path", "error", "retry", "limit", "stream", "batch", "prompt", "reply", "field"),
)
TOOLS = ("Read", "Write", "Edit", "Bash", "Grep", "Glob", "Fetch", "Plan", "Test", "Review")


class SessionTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class AgentRequest:
    """One request of a session: where it goes and its JSON body."""

    route: str
    body: dict[str, Any]


def templated_tokens(tokenizer: SessionTokenizer, messages: list[dict[str, str]]) -> int:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return len(ids)


def sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def paragraph(rng: random.Random, number: int) -> str:
    tool = TOOLS[number % len(TOOLS)]
    return f"## {tool} rule {number}\n" + " ".join(sentence(rng, rng.randint(6, 14)) for _ in range(4))


def largest_fitting(fits: Callable[[int], bool], high: int) -> int:
    """The largest n in [0, high] with fits(n), for a fits that holds up to some n and not after."""
    lo, hi = 0, high
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def system_prompt(tokenizer: SessionTokenizer, target_tokens: int, seed: int = 0) -> str:
    """Seeded rule paragraphs, as many as fit in about `target_tokens` tokens."""
    rng = random.Random(seed)
    paragraphs: list[str] = []
    while len(tokenizer.encode("\n\n".join(paragraphs))) < target_tokens:
        paragraphs += [paragraph(rng, len(paragraphs) + i) for i in range(16)]
    count = largest_fitting(
        lambda n: len(tokenizer.encode("\n\n".join(paragraphs[:n]))) <= target_tokens, len(paragraphs)
    )
    return "\n\n".join(paragraphs[:count])


def reply(turn: int) -> str:
    """The assistant's answer to turn `turn` (the same on every server, whatever it generated)."""
    rng = random.Random(10_000 + turn)
    return f"I ran {TOOLS[turn % len(TOOLS)]} on step {turn}. " + sentence(rng, 24)


def user_message(
    tokenizer: SessionTokenizer, messages: list[dict[str, str]], turn: int, target: int, seed: int
) -> dict[str, str]:
    """A user message (a tool result, then the next ask) that brings the templated conversation
    to about `target` tokens."""
    rng = random.Random(seed * 1_000 + turn)
    words = [rng.choice(WORDS) for _ in range(4 * max(target - templated_tokens(tokenizer, messages), 1))]

    def message(n: int) -> dict[str, str]:
        return {
            "role": "user",
            "content": f"Tool result {turn}: {' '.join(words[:n])}\nNext: continue step {turn}.",
        }

    n = largest_fitting(lambda n: templated_tokens(tokenizer, [*messages, message(n)]) <= target, len(words))
    return message(n)


def build_session(
    tokenizer: SessionTokenizer,
    system_tokens: int,
    turns: int,
    turn_tokens: int = 400,
    first_line: str = "Session 1",
    max_tokens: int = 32,
    seed: int = 0,
) -> list[AgentRequest]:
    """`turns` streaming chat requests: a system prompt of about `system_tokens` tokens that
    opens with `first_line`, and each turn the whole conversation plus about `turn_tokens`."""
    messages = [
        {"role": "system", "content": f"{first_line}\n{system_prompt(tokenizer, system_tokens, seed)}"}
    ]
    requests = []
    for turn in range(turns):
        # the turn's new tokens: the model's last reply (after the first turn), then the user's
        target = templated_tokens(tokenizer, messages) + turn_tokens
        if turn:
            messages.append({"role": "assistant", "content": reply(turn - 1)})
        messages.append(user_message(tokenizer, messages, turn, target, seed))
        requests.append(AgentRequest(CHAT_ROUTE, chat_body(messages, max_tokens)))
    return requests


def chat_body(messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    return {
        "model": "default_model",
        "messages": copy.deepcopy(messages),
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def read_fixture(path: Path) -> list[AgentRequest]:
    """A recorded session: a JSON list of {"route": ..., "body": {...}} in the order sent.
    Bodies are sent streaming (and a chat body asks for its usage)."""
    entries = json.loads(path.read_text())
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "body" in e for e in entries):
        raise ValueError(f"{path}: expected a JSON list of {{'route': ..., 'body': {{...}}}}")
    requests = []
    for entry in entries:
        body = dict(entry["body"]) | {"stream": True}
        route = str(entry.get("route", CHAT_ROUTE))
        if route == CHAT_ROUTE:
            body["stream_options"] = {"include_usage": True}
        requests.append(AgentRequest(route, body))
    return requests
