"""A thinking budget: a row's reasoning is closed after so many tokens, and the answer follows.

llama.cpp's `--reasoning-budget` done the same way: once the row has thought for `budget`
tokens, the next tokens are forced — an optional budget message, then the model's own
end-of-thinking tokens — and sampling carries on from there, so the model writes its answer.
Forcing is a logits processor that leaves one token open, so every sampler, penalty and
log-probability path stays as it is. Until the budget is spent it returns the logits it was
given, untouched: the row's output up to the budget is the output it has without one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import mlx.core as mx

OPENING_WINDOW = 16  # tokens a row may take to open its thinking when the prompt did not


@dataclass(slots=True)
class ThinkingBudget:
    """One row's budget, as an mlx-lm logits processor `(tokens, logits) -> logits`.

    `tokens` is the row's context (prompt, then what it generated); the first call is for its
    first generated token. `inside`: the prompt leaves thinking open (a template that primes
    `<think>`); otherwise thinking counts from the `start` tokens, if the row opens it within
    its first few tokens. `closing` is what is forced: the budget message's tokens, then `end`.
    A row that closes its thinking itself before the budget is left alone.
    """

    budget: int
    closing: tuple[int, ...]
    start: tuple[int, ...]
    end: tuple[int, ...]
    inside: bool
    _first: int | None = None  # context length at the first generated token
    _opened: int | None = None  # how many generated tokens precede the thinking
    _closed_itself: bool | None = None  # known once the budget is reached
    _done: bool = False

    def __post_init__(self) -> None:
        if self.inside:
            self._opened = 0

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self._done:
            return logits
        n = int(tokens.shape[-1])
        if self._first is None:
            self._first = n
        generated = n - self._first
        if self._opened is None and not self._opening(tokens, generated):
            return logits
        assert self._opened is not None
        past = generated - self._opened - self.budget  # tokens since the budget ran out
        if past < 0:
            return logits
        if self._closed_itself is None:
            self._closed_itself = self._closed(tokens, n - past)
        if self._closed_itself or past >= len(self.closing):
            self._done = True
            return logits
        return forced(logits, self.closing[past])

    def _opening(self, tokens: mx.array, generated: int) -> bool:
        """Whether the row has just opened its thinking (checked over its first tokens only)."""
        width = len(self.start)
        if generated > OPENING_WINDOW + width or not width:
            self._done = True
            return False
        if generated >= width and _tail(tokens, int(tokens.shape[-1]), width) == self.start:
            self._opened = generated
            return True
        return False

    def _closed(self, tokens: mx.array, at: int) -> bool:
        """Whether the thinking that ran up to context position `at` already holds `end`."""
        opened = (self._first or 0) + (self._opened or 0)
        span = _ids(tokens[opened:at]) if at > opened else []
        width = len(self.end)
        return any(tuple(span[i : i + width]) == self.end for i in range(len(span) - width + 1))


def _tail(tokens: mx.array, n: int, width: int) -> tuple[int, ...]:
    return tuple(_ids(tokens[n - width : n]))


def _ids(tokens: mx.array) -> list[int]:
    return cast("list[int]", tokens.tolist())


def forced(logits: mx.array, token: int) -> mx.array:
    """`logits` with every token but `token` at -inf: the sampler can only pick it."""
    keep = mx.arange(logits.shape[-1]) == token
    return mx.where(keep, logits, mx.array(-mx.inf, dtype=logits.dtype))
