"""A request's thinking budget over the server's, and effort as template variables."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mlx_serve.protocols import reasoning
from mlx_serve.protocols.contract import ProtocolContext


@pytest.fixture
def thinking(ctx: ProtocolContext) -> ProtocolContext:
    tokenizer = replace(ctx.tokenizer, thinks=True)  # type: ignore[type-var]
    defaults = replace(ctx.defaults, reasoning_budget=64, reasoning_budget_message="Enough.")
    return replace(ctx, tokenizer=tokenizer, defaults=defaults)


@pytest.mark.parametrize(
    ("asked", "effort", "tokens"),
    [(None, None, 64), (10, None, 10), (0, None, 0), (-1, None, None), (None, "none", 0), (None, "high", 64)],
)
def test_the_requests_budget_wins_over_the_servers(
    thinking: ProtocolContext, asked: int | None, effort: str | None, tokens: int | None
) -> None:
    got = reasoning.thinking_budget(thinking, asked, None, "thinking_budget_tokens", effort)
    assert got.tokens == tokens and not got.warnings


def test_the_requests_message_wins_over_the_servers(thinking: ProtocolContext) -> None:
    server = reasoning.thinking_budget(thinking, 5, None, "p")
    asked = reasoning.thinking_budget(thinking, 5, "Stop.", "p")
    silent = reasoning.thinking_budget(thinking, 5, "", "p")
    encode = thinking.tokenizer.encode_continuation
    assert (server.message, asked.message, silent.message) == (
        tuple(encode("Enough.")),
        tuple(encode("Stop.")),
        (),
    )


def test_a_model_that_does_not_think_serves_a_budget_with_a_warning_naming_it(ctx: ProtocolContext) -> None:
    got = reasoning.thinking_budget(ctx, 100, None, "thinking.budget_tokens")
    assert got.tokens is None and len(got.warnings) == 1 and "`thinking.budget_tokens`" in got.warnings[0]
    server_only = replace(ctx, defaults=replace(ctx.defaults, reasoning_budget=8))
    assert reasoning.thinking_budget(server_only, None, None, "p") == reasoning.ThinkingBudget()


def test_effort_goes_to_the_templates_switches() -> None:
    assert reasoning.effort_kwargs(None) == {}
    assert reasoning.effort_kwargs("none") == {"enable_thinking": False, "reasoning_effort": "none"}
    assert reasoning.effort_kwargs("low") == {"enable_thinking": True, "reasoning_effort": "low"}


def test_a_grammar_leaves_no_thinking_to_bound_and_a_request_that_asked_is_told(
    thinking: ProtocolContext,
) -> None:
    asked = reasoning.thinking_budget(thinking, 5, None, "thinking_budget_tokens")
    server = reasoning.thinking_budget(thinking, None, None, "thinking_budget_tokens")
    assert asked.under_grammar(None) == asked
    dropped = asked.under_grammar("start: /x/")
    assert dropped.tokens is None and "`thinking_budget_tokens` did not apply" in dropped.warnings[0]
    assert server.under_grammar("start: /x/") == reasoning.ThinkingBudget()


@pytest.mark.parametrize(("thinks", "reads", "effort", "warned"), [
    (False, False, "high", True), (True, False, "high", False), (False, True, "high", False),
    (False, False, "none", False), (False, False, None, False),
])  # fmt: skip
def test_an_effort_nothing_reads_is_served_with_a_warning(
    ctx: ProtocolContext, thinks: bool, reads: bool, effort: str | None, warned: bool
) -> None:
    model = replace(ctx, tokenizer=replace(ctx.tokenizer, thinks=thinks, reads_effort=reads))  # type: ignore[type-var]
    notes = reasoning.effort_warnings(model, effort, "reasoning_effort")
    assert [("`reasoning_effort` has no effect" in n) for n in notes] == ([True] if warned else [])
