"""Anthropic Messages: POST /v1/messages and POST /v1/messages/count_tokens.

The request's prompt is made in `anthropic_prompt` (conversation, tools offered, context
management); here it becomes the engine request (sampling, grammar, thinking budget, threads,
cache diagnostics), and the replies are rendered by `anthropic_stream`. Every field the current
SDK and Claude Code send is honoured or refused by name with a 400.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import msgspec
import orjson

from mlx_serve.engine.errors import InvalidRequest, ServeError
from mlx_serve.engine.types import Request
from mlx_serve.protocols import anthropic_diagnostics as diagnostics
from mlx_serve.protocols import conversation as conv
from mlx_serve.protocols import openai_common as common
from mlx_serve.protocols import reasoning, structured
from mlx_serve.protocols.anthropic_diagnostics import CacheDiagnoser, Diagnosis
from mlx_serve.protocols.anthropic_prompt import render, system_text, thinking_enabled
from mlx_serve.protocols.anthropic_request import (
    COUNT_DECODER,
    MESSAGES_DECODER,
    Display,
    MessagesBody,
    PromptBody,
    Thinking,
    ThinkingAdaptive,
    ThinkingDisabled,
    ThinkingEnabled,
    ToolChoiceAny,
    ToolChoiceTool,
)
from mlx_serve.protocols.anthropic_stream import (
    MessagesJob,
    MessageStream,
    error_body,
    error_json,
    message_json,
    stop_reason,
    tool_use_id,
    usage_json,
)
from mlx_serve.protocols.anthropic_threads import ThreadStore, ThreadTurn
from mlx_serve.protocols.contract import Job, ProtocolContext, Result

__all__ = ["FORMAT", "MessagesJob", "count_tokens", "error_body", "error_json", "parse_body"]
__all__ += ["render", "stop_reason", "tool_use_id", "usage_json"]

ID_PREFIX = "msg"


# --- parse -------------------------------------------------------------------------------------


def parse_body(
    body: bytes,
    ctx: ProtocolContext,
    threads: ThreadStore | None = None,
    diagnoser: CacheDiagnoser | None = None,
) -> MessagesJob:
    """Decode, validate and render one Messages request; ServeError 400 on any fault. With
    `threads`, a request on a thread gets the thread's conversation (see anthropic_threads);
    with `diagnoser`, one that asks is told why the cache missed (anthropic_diagnostics)."""
    req = common.decode(MESSAGES_DECODER, body)
    req, turn = _on_thread(req, threads, ctx)
    prompt = render(req, ctx)
    constraint = _grammar(req, prompt.tools)
    thinking = _thinking_budget(req, ctx).under_grammar(constraint.grammar)
    request = Request(
        id=conv.new_id(ID_PREFIX),
        prompt_tokens=tuple(prompt.ids),
        sampling=conv.sampling(ctx, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k),
        max_tokens=req.max_tokens,
        stop=tuple(req.stop_sequences or ()),
        tools=prompt.tools,
        grammar=constraint.grammar,
        forced_tool_calls=constraint.forced,
        thinking_budget=thinking.tokens,
        thinking_budget_message=thinking.message,
    )
    edits = None if prompt.applied_edits is None else tuple(prompt.applied_edits)
    diagnosis = _diagnosis(req, ctx, diagnoser, request.id, len(prompt.ids))
    return MessagesJob(
        request,
        stream=bool(req.stream),
        model=req.model,
        warnings=prompt.warnings + constraint.warnings + thinking.warnings,
        show_thinking=_display(req.thinking) != "omitted",
        applied_edits=edits,
        thread=turn,
        diagnosis=diagnosis,
        log_fields=diagnosis.log_fields() if diagnosis is not None else (),
    )


def _diagnosis(
    req: MessagesBody, ctx: ProtocolContext, diagnoser: CacheDiagnoser | None, message_id: str, tokens: int
) -> Diagnosis | None:
    """The request against the key's earlier one, when it asks (`diagnostics`, or the beta)."""
    by_header = diagnostics.BETA in ctx.betas
    if diagnoser is None or (req.diagnostics is None and not by_header):
        return None
    system = "" if req.system is None else system_text(req.system, ctx.keep_billing_header)
    other = [thinking_enabled(req.thinking), msgspec.to_builtins(req.tool_choice)]
    now = diagnostics.prompt_print(req, system, other, tokens)
    named = req.diagnostics.previous_message_id if req.diagnostics is not None else None
    return diagnoser.diagnose(message_id, ctx.principal, named, by_header, now)


def _on_thread(
    req: MessagesBody, threads: ThreadStore | None, ctx: ProtocolContext
) -> tuple[MessagesBody, ThreadTurn | None]:
    if threads is None:
        if req.thread is not None:
            raise common.unsupported("thread", "`thread` (server-held conversation state)")
        return req, None
    full, turn = threads.turn(req, ctx.principal)
    assert isinstance(full, MessagesBody)
    return full, turn


def count_tokens(body: bytes, ctx: ProtocolContext, threads: ThreadStore | None = None) -> tuple[int, bytes]:
    """POST /v1/messages/count_tokens: (status, JSON body), errors in Anthropic's envelope.
    With context management, `context_management.original_input_tokens` is the count before;
    a thread's `continue` counts the thread's conversation with the new messages."""
    try:
        req = common.decode(COUNT_DECODER, body)
        if threads is not None:
            req, _ = threads.turn(req, ctx.principal)
        prompt = render(req, ctx)
    except ServeError as exc:
        return exc.status, error_body(exc)
    out: dict[str, Any] = {"input_tokens": len(prompt.ids)}
    if req.context_management is not None:
        out["context_management"] = {"original_input_tokens": prompt.original_tokens}
    return 200, orjson.dumps(out)


def _grammar(req: PromptBody, tools: tuple[dict[str, Any], ...] | None) -> structured.Constraint:
    """The grammar the answer follows (a forced tool choice, else the output format)."""
    choice = req.tool_choice
    name = choice.name if isinstance(choice, ToolChoiceTool) else None
    # `any` may make several calls unless told not to; a named tool makes one.
    parallel = isinstance(choice, ToolChoiceAny) and not choice.disable_parallel_tool_use
    forced = structured.forced_calls(tools, name, isinstance(choice, ToolChoiceAny), parallel)
    fmt, param = req.output_format, "output_format"
    if req.output_config is not None and req.output_config.format is not None:
        if fmt is not None:
            raise InvalidRequest(
                "give `output_config.format` or `output_format`, not both", param="output_format"
            )
        fmt, param = req.output_config.format, "output_config.format"
    output = None if fmt is None else structured.json_schema(fmt.schema, f"{param}.schema")
    return structured.pick(forced, output, param)


def _thinking_budget(req: PromptBody, ctx: ProtocolContext) -> reasoning.ThinkingBudget:
    """`thinking.budget_tokens` bounds the thinking (protocols.reasoning); disabled thinking is a
    budget of 0, so a model whose template always opens its thinking closes it at once."""
    thinking = req.thinking
    asked = thinking.budget_tokens if isinstance(thinking, ThinkingEnabled) else None
    effort = "none" if isinstance(thinking, ThinkingDisabled) else None
    budget = reasoning.thinking_budget(ctx, asked, None, "thinking.budget_tokens", effort)
    level = req.output_config.effort if req.output_config is not None else None
    return replace(
        budget, warnings=budget.warnings + reasoning.effort_warnings(ctx, level, "output_config.effort")
    )


def _display(thinking: Thinking | None) -> Display:
    return thinking.display if isinstance(thinking, ThinkingEnabled | ThinkingAdaptive) else None


def _own(job: Job) -> MessagesJob:
    if not isinstance(job, MessagesJob):
        raise TypeError(f"not a Messages job: {type(job).__name__}")
    return job


class AnthropicMessages:
    """The WireFormat of POST /v1/messages; with a ThreadStore, it serves message threads (one
    instance per App owns it; without one, `thread` is refused by name), and with a
    CacheDiagnoser, cache-miss diagnostics."""

    def __init__(self, threads: ThreadStore | None = None, diagnoser: CacheDiagnoser | None = None) -> None:
        self.threads = threads
        self.diagnoser = diagnoser

    def parse(self, body: bytes, ctx: ProtocolContext) -> MessagesJob:
        return parse_body(body, ctx, self.threads, self.diagnoser)

    def renderer(self, job: Job, ctx: ProtocolContext) -> MessageStream:
        own = _own(job)
        return MessageStream(own, self._keeper(own, ctx))

    def _keeper(
        self, job: MessagesJob, ctx: ProtocolContext
    ) -> Callable[[list[dict[str, Any]]], None] | None:
        """What keeps the reply of a turn on a thread (None: the turn is on none)."""
        threads, turn = self.threads, job.thread
        if threads is None or turn is None:
            return None
        return lambda reply: threads.keep(job.request.id, turn, reply, ctx.principal)

    def to_json(self, job: Job, results: list[Result], ctx: ProtocolContext) -> bytes:
        own = _own(job)
        message = message_json(own, results[0])
        if (keep := self._keeper(own, ctx)) is not None:
            keep(message["content"])
        return orjson.dumps(message)

    def error_body(self, exc: ServeError) -> bytes:
        return error_body(exc)

    def count_tokens(self, body: bytes, ctx: ProtocolContext) -> tuple[int, bytes]:
        return count_tokens(body, ctx, self.threads)


FORMAT = AnthropicMessages()
