"""Reasoning control every wire format shares: a thinking budget and its message, and effort.

A budget is llama.cpp's: the reasoning tokens a row may write before the engine forces the
model's own end-of-thinking (after the budget message, when there is one) and the answer
follows (engine.rows.thinking_budget). -1 is unbounded, 0 closes the thinking at once. A
request's budget wins over the server's `--reasoning-budget`, its message over
`--reasoning-budget-message`. Effort goes to the chat template's own switches:
`enable_thinking` (off for "none") and `reasoning_effort` (templates that read a level); "none"
also sets a budget of 0, so a model whose template has no switch still stops thinking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx_serve.protocols.contract import ProtocolContext
from mlx_serve.protocols.conversation import warning

UNBOUNDED = -1


@dataclass(frozen=True, slots=True)
class ThinkingBudget:
    """What goes on the engine Request (`thinking_budget`, `thinking_budget_message`), and the
    notes owed to the client."""

    tokens: int | None = None
    message: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()
    asked_by: str | None = None  # the request's field that set it; None: the server's default

    def under_grammar(self, grammar: str | None) -> ThinkingBudget:
        """The budget once the answer's grammar is known: a grammar shapes the answer from its
        first token, so there is no thinking to bound; a request that asked for one is told."""
        if grammar is None or self.tokens is None:
            return self
        if self.asked_by is None:
            return ThinkingBudget(warnings=self.warnings)
        note = f"`{self.asked_by}` did not apply: a structured output format or forced tool call leaves no thinking"
        return ThinkingBudget(warnings=(*self.warnings, warning(note)))


def thinking_budget(
    ctx: ProtocolContext, asked: int | None, message: str | None, param: str, effort: str | None = None
) -> ThinkingBudget:
    """The budget a request runs under: `asked` (its own field, named `param`), else 0 for
    effort "none", else the server's; a model without thinking markers has none to bound."""
    if asked is None and effort == "none":
        asked = 0
    value = ctx.defaults.reasoning_budget if asked is None else asked
    if value is None or value <= UNBOUNDED:
        return ThinkingBudget()
    if not ctx.tokenizer.thinks:
        if asked is None:
            return ThinkingBudget()
        note = f"{ctx.model_id} does not write its reasoning apart: `{param}` has no thinking to bound"
        return ThinkingBudget(warnings=(warning(note),))
    text = ctx.defaults.reasoning_budget_message if message is None else message
    tokens = tuple(ctx.tokenizer.encode_continuation(text)) if text else ()
    return ThinkingBudget(value, tokens, asked_by=None if asked is None else param)


def effort_warnings(ctx: ProtocolContext, effort: str | None, param: str) -> tuple[str, ...]:
    """The note a request asking for an effort gets when nothing reads it: the model neither
    thinks apart nor has a template that takes a reasoning switch ("none" asks for nothing)."""
    if effort in (None, "none") or ctx.tokenizer.thinks or ctx.tokenizer.reads_effort:
        return ()
    return (
        warning(
            f"{ctx.model_id} does not reason apart and its chat template reads no effort: `{param}` has no effect"
        ),
    )


def effort_kwargs(effort: str | None) -> dict[str, Any]:
    """A reasoning effort as chat-template variables; None leaves the server's in charge."""
    if effort is None:
        return {}
    return {"enable_thinking": effort != "none", "reasoning_effort": effort}
