"""Responses answers: output items, the response object and its streamed event chain.

Every response object carries the fields Open Responses requires (settings echoed with their
defaults applied); every event carries `type` and `sequence_number`; a stream ends with the
terminal `response.*` event and the literal `[DONE]`, as the specification says.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlx_serve.engine.errors import InvalidRequest, QueueFull, ServeError
from mlx_serve.engine.types import (
    Admitted,
    Delta,
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from mlx_serve.protocols import conversation as conv
from mlx_serve.protocols import openai_render as render
from mlx_serve.protocols.contract import KEEP_ALIVE, Frame, Frames, Job, ProtocolContext, Result, SseEvent
from mlx_serve.protocols.responses_input import InputItem, opaque
from mlx_serve.protocols.responses_tools import Offered, Toolset, custom_input

DONE = SseEvent("[DONE]")


@dataclass(frozen=True, slots=True)
class ResponsesJob(Job):
    """A Responses call: what the response object repeats, the conversation to store, the
    tools as the answer names them, and whether reasoning comes back in `encrypted_content`."""

    echo: dict[str, Any] = field(default_factory=dict)
    history: tuple[InputItem, ...] = ()
    new_input: tuple[InputItem, ...] = ()
    store: bool = True
    tools: Toolset = field(default_factory=Toolset)
    keep_reasoning: bool = False
    owner: str = ""  # who may read and continue it once stored


Remember = Callable[[ResponsesJob, dict[str, Any], list[dict[str, Any]]], bytes]


def usage_json(usage: Usage) -> dict[str, Any]:
    # The engine's Usage gains reasoning_tokens with reasoning support; until then it is 0.
    reasoning_tokens = int(getattr(usage, "reasoning_tokens", 0))
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.total_tokens,
        **render.speculation_json(usage),
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def message_item(item_id: str, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [text_part(text)]
    return {"id": item_id, "type": "message", "status": status, "content": content, "role": "assistant"}


def reasoning_item(item_id: str, status: str, text: str | None, keep: bool = False) -> dict[str, Any]:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    item = {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}
    if keep and text:  # include: ["reasoning.encrypted_content"]
        item["encrypted_content"] = opaque(text)
    return item


def call_item(item_id: str, status: str, call_id: str, tool: Offered, arguments: str) -> dict[str, Any]:
    """A `function_call`, or a `custom_tool_call` for a freeform tool, as the API names it."""
    item: dict[str, Any] = {"id": item_id, "type": "function_call", "status": status}
    if tool.kind == "custom":
        item.update(type="custom_tool_call", input=custom_input(arguments))
    else:
        item["arguments"] = arguments
    item.update(call_id=call_id, name=tool.name)
    if tool.namespace is not None:
        item["namespace"] = tool.namespace
    return item


def call_id_prefix(tool: Offered) -> str:
    return "ctc" if tool.kind == "custom" else "fc"


def output_items(job: ResponsesJob, result: Result) -> list[dict[str, Any]]:
    """A whole answer's items; the last is "incomplete" when max_output_tokens cut it."""
    out: list[dict[str, Any]] = []
    if result.reasoning:
        out.append(reasoning_item(conv.new_id("rs"), "completed", result.reasoning, job.keep_reasoning))
    if result.text:
        out.append(message_item(conv.new_id("msg"), "completed", result.text))
    for c in result.tool_calls:
        tool = job.tools.called(c.name)
        out.append(call_item(conv.new_id(call_id_prefix(tool)), "completed", c.id, tool, c.arguments))
    if out and result.finish_reason is FinishReason.LENGTH:
        out[-1]["status"] = "incomplete"
    return out


def response_json(
    job: ResponsesJob,
    ctx: ProtocolContext,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": job.request.id,
        "object": "response",
        "created_at": ctx.created,
        "status": status,
        "background": False,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": incomplete,
        "model": job.model,
        "output": output,
        **job.echo,
        "usage": None if usage is None else usage_json(usage),
    }


def finished_status(reason: FinishReason) -> str:
    return "incomplete" if reason is FinishReason.LENGTH else "completed"


def failure_json(exc: ServeError) -> dict[str, Any]:
    """A failed response's `error`, with the codes the API uses there."""
    if isinstance(exc, QueueFull):
        code = "rate_limit_exceeded"
    elif isinstance(exc, InvalidRequest):
        code = "invalid_prompt"
    else:
        code = "server_error"
    error = render.error_json(exc)["error"]
    return {"code": code, "message": exc.message, "param": exc.param, "type": error["type"]}


@dataclass(slots=True)
class _OpenItem:
    kind: str
    item_id: str
    pieces: list[str] = field(default_factory=list)
    call_index: int = -1
    call_id: str = ""
    tool: Offered | None = None


class ResponseStream:
    """The Responses event chain with sequence numbers: response.created, .in_progress, then
    per output item added / (content part added, deltas, done) / done, a terminal
    response.completed, .incomplete or .failed (after an `error` event), then `[DONE]`.
    Items arrive one after another.
    """

    def __init__(self, remember: Remember, job: ResponsesJob, ctx: ProtocolContext) -> None:
        self._remember = remember
        self._job = job
        self._ctx = ctx
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        self._open: _OpenItem | None = None

    def _emit(self, kind: str, **payload: Any) -> SseEvent:
        event = SseEvent({"type": kind, **payload, "sequence_number": self._seq}, kind)
        self._seq += 1
        return event

    def _at(self, item: _OpenItem) -> dict[str, Any]:
        return {"item_id": item.item_id, "output_index": len(self._output)}

    def start(self, admitted: Admitted | None = None) -> Frames:
        response = response_json(self._job, self._ctx, "in_progress", [])
        return [
            self._emit("response.created", response=response),
            self._emit("response.in_progress", response=response),
        ]

    def delta(self, event: Delta, index: int = 0) -> Frames:
        if isinstance(event, TextDelta | ReasoningDelta):
            if not event.text:
                return []
            kind = "message" if isinstance(event, TextDelta) else "reasoning"
            out = [] if self._open and self._open.kind == kind else self._begin(kind)
            return [*out, self._text(event.text)]
        if isinstance(event, ToolCallStart):
            return self._begin_call(event)
        return self._call_args(event)

    def _begin(self, kind: str) -> Frames:
        out = self._close("completed")
        item = self._open = _OpenItem(kind, conv.new_id("msg" if kind == "message" else "rs"))
        if kind == "message":
            added, part = message_item(item.item_id, "in_progress", None), text_part("")
        else:
            added, part = (
                reasoning_item(item.item_id, "in_progress", None),
                {"type": "reasoning_text", "text": ""},
            )
        return [
            *out,
            self._emit("response.output_item.added", output_index=len(self._output), item=added),
            self._emit("response.content_part.added", **self._at(item), content_index=0, part=part),
        ]

    def _text(self, text: str) -> SseEvent:
        item = self._open
        assert item is not None
        item.pieces.append(text)
        if item.kind == "message":
            return self._emit(
                "response.output_text.delta", **self._at(item), content_index=0, delta=text, logprobs=[]
            )
        return self._emit("response.reasoning_text.delta", **self._at(item), content_index=0, delta=text)

    def _begin_call(self, event: ToolCallStart) -> Frames:
        out = self._close("completed")
        tool = self._job.tools.called(event.name)
        item = self._open = _OpenItem(
            tool.kind, conv.new_id(call_id_prefix(tool)), call_index=event.index, call_id=event.id, tool=tool
        )
        added = call_item(item.item_id, "in_progress", item.call_id, tool, "")
        if tool.kind == "custom":
            added["input"] = ""
        return [*out, self._emit("response.output_item.added", output_index=len(self._output), item=added)]

    def _call_args(self, event: ToolCallArgsDelta) -> Frames:
        item = self._open
        if item is None or item.call_index != event.index or not event.arguments:
            return []
        item.pieces.append(event.arguments)
        if item.kind == "custom":
            return []  # the input is JSON-decoded whole when the call ends
        return [self._emit("response.function_call_arguments.delta", **self._at(item), delta=event.arguments)]

    def _close(self, status: str) -> Frames:
        item, self._open = self._open, None
        if item is None:
            return []
        text, at = "".join(item.pieces), self._at(item)
        out: Frames
        if item.tool is not None:
            out, done = self._close_call(item, text, status)
        elif item.kind == "message":
            out = [
                self._emit("response.output_text.done", **at, content_index=0, text=text, logprobs=[]),
                self._emit("response.content_part.done", **at, content_index=0, part=text_part(text)),
            ]
            done = message_item(item.item_id, status, text)
        else:
            part = {"type": "reasoning_text", "text": text}
            out = [
                self._emit("response.reasoning_text.done", **at, content_index=0, text=text),
                self._emit("response.content_part.done", **at, content_index=0, part=part),
            ]
            done = reasoning_item(item.item_id, status, text, self._job.keep_reasoning)
        out.append(self._emit("response.output_item.done", output_index=len(self._output), item=done))
        self._output.append(done)
        return out

    def _close_call(self, item: _OpenItem, text: str, status: str) -> tuple[Frames, dict[str, Any]]:
        assert item.tool is not None
        done = call_item(item.item_id, status, item.call_id, item.tool, text)
        at = self._at(item)
        if item.tool.kind == "custom":
            value = done["input"]
            return [
                self._emit("response.custom_tool_call_input.delta", **at, delta=value),
                self._emit("response.custom_tool_call_input.done", **at, input=value),
            ], done
        return [self._emit("response.function_call_arguments.done", **at, arguments=text)], done

    def finish(self, event: Finished, index: int = 0) -> Frames:
        out = self._close("incomplete" if event.reason is FinishReason.LENGTH else "completed")
        status = finished_status(event.reason)
        response = response_json(self._job, self._ctx, status, self._output, event.usage)
        self._remember(self._job, response, self._output)
        return [*out, self._emit(f"response.{status}", response=response), DONE]

    def error(self, exc: ServeError) -> Frames:
        out = self._close("incomplete")
        failure = failure_json(exc)
        response = response_json(self._job, self._ctx, "failed", self._output, error=failure)
        # Open Responses nests the error; OpenAI's error event has the same fields flat.
        error = self._emit("error", error=failure, code=failure["code"], message=exc.message, param=exc.param)
        return [*out, error, self._emit("response.failed", response=response), DONE]

    def heartbeat(self) -> Frame:
        return KEEP_ALIVE
