"""Model reasoning (`<think>…</think>` and the like) split from the answer while streaming.

The markers are the ones mlx-lm infers for the tokenizer (`think_start` / `think_end`). A
marker split across tokens is held back, never leaked; a chat template that primes an open
`<think>` in the prompt starts the split inside the reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx_serve.engine.text.stops import partial_suffix_len
from mlx_serve.engine.types import Delta, ReasoningDelta, TextDelta


@dataclass(slots=True)
class ReasoningSplitter:
    start: str
    end: str
    inside: bool = False
    _held: str = ""

    def feed(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        buf, self._held = self._held + text, ""
        while buf:
            marker = self.end if self.inside else self.start
            at = buf.find(marker)
            if at == -1:
                keep = partial_suffix_len(buf, (marker,))
                self._held = buf[len(buf) - keep :] if keep else ""
                self._put(out, buf[: len(buf) - keep])
                return out
            self._put(out, buf[:at])
            self.inside = not self.inside
            buf = buf[at + len(marker) :]
        return out

    def close(self) -> list[Delta]:
        out: list[Delta] = []
        self._put(out, self._held)
        self._held = ""
        return out

    def _put(self, out: list[Delta], text: str) -> None:
        if text:
            out.append(ReasoningDelta(text) if self.inside else TextDelta(text))


def reasoning_splitter(tokenizer: Any, prompt: tuple[int, ...]) -> ReasoningSplitter | None:
    """A splitter for a thinking model, started inside when the prompt leaves `<think>` open."""
    start, end = getattr(tokenizer, "think_start", None), getattr(tokenizer, "think_end", None)
    if not start or not end:
        return None
    opened = _last(prompt, getattr(tokenizer, "think_start_tokens", None) or ())
    closed = _last(prompt, getattr(tokenizer, "think_end_tokens", None) or ())
    return ReasoningSplitter(start, end, inside=opened > closed)


def _last(tokens: tuple[int, ...], marker: tuple[int, ...]) -> int:
    """Where the last occurrence of `marker` ends in `tokens`, or -1 (the prompt's tail only)."""
    n = len(marker)
    if not n:
        return -1
    for i in range(len(tokens) - n, max(len(tokens) - 64, -1), -1):
        if tokens[i : i + n] == marker:
            return i + n
    return -1
