"""Fixtures for the protocol tests: a fake tokenizer and a context; no model, no MLX."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from mlx_serve.engine.types import SamplingParams
from mlx_serve.protocols.contract import Defaults, Frames, ProtocolContext
from mlx_serve.server.writer import encode

VOCAB_SIZE = 1000
CREATED = 1_700_000_000
MODEL_ID = "test-org/tiny-model"


@dataclass(frozen=True, slots=True)
class ChatCall:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any] | None


@dataclass(slots=True)
class FakeTokenizer:
    """Duck-types engine.model.tokenizer.ChatTokenizer: one token per character, calls recorded."""

    vocab_size: int = VOCAB_SIZE
    template_error: str | None = None
    supports_tools: bool = True
    system_turns: bool = True
    thinks: bool = False  # writes its reasoning between thinking markers
    reads_effort: bool = True  # its template takes enable_thinking / reasoning_effort
    chat_calls: list[ChatCall] = field(default_factory=list)

    def encode(self, text: str) -> list[int]:
        return [ord(ch) % self.vocab_size for ch in text]

    def encode_continuation(self, text: str) -> list[int]:
        return self.encode(text)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        self.chat_calls.append(ChatCall(messages, tools, template_kwargs))
        if self.template_error is not None:
            raise ValueError(self.template_error)
        text = "".join(_rendered(m) for m in messages) + "<assistant>"
        return self.encode(text)


def _rendered(message: dict[str, Any]) -> str:
    # Reasoning and calls count too, as a real template writes them.
    thought = f"<think>{message['reasoning_content']}</think>" if message.get("reasoning_content") else ""
    calls = orjson.dumps(message["tool_calls"]).decode() if message.get("tool_calls") else ""
    return f"<{message['role']}>{thought}{message['content']}{calls}"


@pytest.fixture
def tokenizer() -> FakeTokenizer:
    return FakeTokenizer()


@pytest.fixture
def defaults() -> Defaults:
    return Defaults(
        SamplingParams(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05),
        max_tokens=256,
        chat_template_args={"enable_thinking": False, "house": "server"},
    )


@pytest.fixture
def ctx(tokenizer: FakeTokenizer, defaults: Defaults) -> ProtocolContext:
    return ProtocolContext(
        model_id=MODEL_ID,
        tokenizer=tokenizer,
        defaults=defaults,  # type: ignore[arg-type]
        created=CREATED,
    )


@pytest.fixture
def body() -> Callable[..., bytes]:
    """Encode a request body from keyword fields."""

    def make(**fields: Any) -> bytes:
        return orjson.dumps(fields)

    return make


@pytest.fixture
def sse_frames() -> Callable[[Frames], list[Any]]:
    """A renderer's events as the writer sends them, split into decoded `data:` payloads
    ("[DONE]" stays a string)."""

    def split(events: Frames) -> list[Any]:
        stream = encode(events)
        assert stream.endswith(b"\n\n"), stream
        frames: list[Any] = []
        for raw in stream[:-2].split(b"\n\n"):
            assert raw.startswith(b"data: "), raw
            payload = raw[len(b"data: ") :]
            frames.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
        return frames

    return split
