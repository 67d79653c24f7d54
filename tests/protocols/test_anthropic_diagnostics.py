"""Anthropic's cache-miss diagnostics: a request that asks is told what changed since the key's
earlier request, or why the cache missed though nothing did, in Anthropic's shapes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from anthropic._models import construct_type
from anthropic.types.beta import BetaMessage

from mlx_serve.engine.types import CacheMiss, Finished, FinishReason, TextDelta, Usage
from mlx_serve.protocols.anthropic_diagnostics import BETA, CacheDiagnoser
from mlx_serve.protocols.anthropic_messages import AnthropicMessages
from mlx_serve.protocols.contract import Job, ProtocolContext
from tests.protocols.scripted import render_json, render_stream, sse_events

BASH: Any = {"name": "Bash", "input_schema": {"type": "object", "properties": {}}}
FIRST: Any = [{"role": "user", "content": "hi"}]
NEXT: Any = [*FIRST, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]


@pytest.fixture
def fmt() -> AnthropicMessages:
    return AnthropicMessages(diagnoser=CacheDiagnoser())


def ask(fmt: AnthropicMessages, ctx: ProtocolContext, **fields: Any) -> Job:
    body = {"model": "m", "max_tokens": 8, "system": "rules", "tools": [BASH], "messages": FIRST, **fields}
    return fmt.parse(orjson.dumps(body), ctx)


def answer(fmt: AnthropicMessages, ctx: ProtocolContext, job: Job, usage: Usage) -> dict[str, Any]:
    events = [TextDelta("ok"), Finished(FinishReason.STOP, usage)]
    body: dict[str, Any] = orjson.loads(render_json(fmt, job, ctx, events))
    reason = (body.get("diagnostics") or {}).get("cache_miss_reason") or {}
    if reason.get("type") in ("evicted", "cold"):
        # Our own reasons: the SDK reads them as it reads any reason (its strict mode knows
        # only Anthropic's six).
        read = construct_type(type_=BetaMessage, value=body).diagnostics.cache_miss_reason  # type: ignore[attr-defined]
        assert (read.type, read.cache_missed_input_tokens) == (
            reason["type"],
            reason["cache_missed_input_tokens"],
        )
    else:
        BetaMessage.model_validate(body)  # the SDK's own type reads it
    return body


def after(previous: Job) -> dict[str, Any]:
    return {"diagnostics": {"previous_message_id": previous.request.id}}


def used(job: Job, cached: int = 0, miss: CacheMiss | None = None) -> Usage:
    return Usage(len(job.request.prompt_tokens), 1, cached_tokens=cached, cache_miss=miss)


def test_no_diagnostics_unless_asked(fmt: AnthropicMessages, ctx: ProtocolContext) -> None:
    job = ask(fmt, ctx)
    assert "diagnostics" not in answer(fmt, ctx, job, used(job))
    first = ask(fmt, ctx, diagnostics={"previous_message_id": None})
    assert answer(fmt, ctx, first, used(first))["diagnostics"] is None  # the first turn: nothing to compare


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"system": "new rules"}, "system_changed"),
        ({"tools": [{**BASH, "description": "Runs"}]}, "tools_changed"),
        ({"model": "other"}, "model_changed"),
        ({"messages": [{"role": "user", "content": "HI"}, *NEXT[1:]]}, "messages_changed"),
    ],
)
def test_what_changed_is_named_with_the_tokens_it_cost(
    fmt: AnthropicMessages, ctx: ProtocolContext, change: dict[str, Any], reason: str
) -> None:
    first = ask(fmt, ctx, diagnostics={"previous_message_id": None})
    second = ask(fmt, ctx, **{"messages": NEXT, **change}, **after(first))
    body = answer(fmt, ctx, second, used(second, cached=10))
    missed = len(first.request.prompt_tokens) - 10
    assert body["diagnostics"] == {"cache_miss_reason": {"type": reason, "cache_missed_input_tokens": missed}}
    assert second.log_fields == (("cache_miss_reason", reason),)


def test_other_prompt_fields_changing_is_unavailable(fmt: AnthropicMessages, ctx: ProtocolContext) -> None:
    first = ask(fmt, ctx, diagnostics={"previous_message_id": None})
    second = ask(fmt, ctx, messages=NEXT, thinking={"type": "adaptive"}, **after(first))
    assert answer(fmt, ctx, second, used(second))["diagnostics"] == {
        "cache_miss_reason": {"type": "unavailable"}
    }


@pytest.mark.parametrize(("miss", "reason"), [(CacheMiss.EVICTED, "evicted"), (CacheMiss.COLD, "cold")])
def test_a_prompt_that_extends_the_last_yet_missed_says_why(
    fmt: AnthropicMessages, ctx: ProtocolContext, miss: CacheMiss, reason: str
) -> None:
    first = ask(fmt, ctx, diagnostics={"previous_message_id": None})
    second = ask(fmt, ctx, messages=NEXT, **after(first))
    assert second.log_fields == ()
    body = answer(fmt, ctx, second, used(second, cached=4, miss=miss))
    missed = len(first.request.prompt_tokens) - 4
    assert body["diagnostics"] == {"cache_miss_reason": {"type": reason, "cache_missed_input_tokens": missed}}
    # Served from the cache as far as the earlier prompt went: no miss to report.
    third = ask(fmt, ctx, messages=NEXT, **after(first))
    hit = len(first.request.prompt_tokens)
    assert answer(fmt, ctx, third, used(third, cached=hit))["diagnostics"] is None


def test_an_unknown_previous_message_is_not_found(fmt: AnthropicMessages, ctx: ProtocolContext) -> None:
    job = ask(fmt, ctx, diagnostics={"previous_message_id": "msg_gone"})
    body = answer(fmt, ctx, job, used(job))
    assert body["diagnostics"] == {"cache_miss_reason": {"type": "previous_message_not_found"}}
    assert job.log_fields == (("cache_miss_reason", "previous_message_not_found"),)


def test_the_beta_header_compares_with_the_keys_last_request_for_the_model(
    fmt: AnthropicMessages, ctx: ProtocolContext
) -> None:
    mine = replace(ctx, betas=frozenset({BETA}), principal="key-a")
    first = ask(fmt, mine)
    ask(fmt, replace(mine, principal="key-b"), system="theirs")  # another key's: not compared
    second = ask(fmt, mine, system="changed", messages=NEXT)
    assert answer(fmt, mine, second, used(second))["diagnostics"]["cache_miss_reason"] == {
        "type": "system_changed",
        "cache_missed_input_tokens": len(first.request.prompt_tokens),
    }


def test_claude_codes_changing_billing_line_is_no_system_change(
    fmt: AnthropicMessages, ctx: ProtocolContext
) -> None:
    def system(cch: str) -> Any:
        billing = f"x-anthropic-billing-header: cc_version=2.1.332.0b8; cc_entrypoint=cli; cch={cch};"
        return [{"type": "text", "text": billing}, {"type": "text", "text": "You are Claude Code."}]

    first = ask(fmt, ctx, system=system("a1b2c"), diagnostics={"previous_message_id": None})
    second = ask(fmt, ctx, system=system("d3e4f"), messages=NEXT, **after(first))
    assert second.log_fields == ()


def test_a_stream_says_pending_at_start_and_the_reason_at_the_end(
    fmt: AnthropicMessages, ctx: ProtocolContext
) -> None:
    first = ask(fmt, ctx, diagnostics={"previous_message_id": None})
    second = ask(fmt, ctx, system="new", messages=NEXT, stream=True, **after(first))
    events = [TextDelta("ok"), Finished(FinishReason.STOP, used(second))]
    frames = dict(sse_events(render_stream(fmt, second, ctx, events)))
    assert frames["message_start"]["message"]["diagnostics"] == {"cache_miss_reason": None}
    reason = frames["message_delta"]["diagnostics"]["cache_miss_reason"]
    assert reason["type"] == "system_changed" and reason["cache_missed_input_tokens"] > 0
