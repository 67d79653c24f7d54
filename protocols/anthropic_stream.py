"""Anthropic Messages answers: the message object, its SSE event grammar, errors and usage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from mlx_serve.engine.errors import EngineFailed, ServeError
from mlx_serve.engine.tools.json_scan import partial_value
from mlx_serve.engine.types import (
    Admitted,
    Delta,
    Finished,
    FinishReason,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from mlx_serve.protocols import openai_render as render
from mlx_serve.protocols.anthropic_diagnostics import PENDING, Diagnosis
from mlx_serve.protocols.anthropic_threads import ThreadTurn
from mlx_serve.protocols.contract import Frame, Frames, Job, Result, SseEvent, ToolCall

TOOL_ID_PREFIX = "toolu_"

_STOP_REASONS = {
    FinishReason.STOP: "end_turn",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.TOOL_CALLS: "tool_use",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


@dataclass(frozen=True, slots=True)
class MessagesJob(Job):
    """A Messages call: `show_thinking` is False when thinking.display is "omitted";
    `applied_edits` is what context management changed (None when the request asked none)."""

    show_thinking: bool = True
    applied_edits: tuple[dict[str, Any], ...] | None = None
    thread: ThreadTurn | None = None  # a turn on a message thread, kept once answered
    diagnosis: Diagnosis | None = None  # asked for `diagnostics` (anthropic_diagnostics)

    def diagnostics(self, usage: Usage | None) -> dict[str, Any]:
        """The response's `diagnostics` field when asked (None usage: pending, in message_start)."""
        if self.diagnosis is None:
            return {}
        return {"diagnostics": PENDING if usage is None else self.diagnosis.json(usage)}

    def context_management(self) -> dict[str, Any]:
        """The response's `context_management` field, when the request had one."""
        if self.applied_edits is None:
            return {}
        return {"context_management": {"applied_edits": list(self.applied_edits)}}


def tool_use_id(call_id: str) -> str:
    """Engine call ids (`call_…`) in Anthropic's spelling (`toolu_…`)."""
    if call_id.startswith(TOOL_ID_PREFIX):
        return call_id
    return TOOL_ID_PREFIX + call_id.removeprefix("call_")


def stop_reason(reason: FinishReason, stop_sequence: str | None) -> str:
    return "stop_sequence" if stop_sequence is not None else _STOP_REASONS[reason]


def usage_json(usage: Usage) -> dict[str, Any]:
    """Anthropic counts cache reads apart: input + cache_read is the whole prompt."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        **render.speculation_json(usage),
    }


def _message_head(job: Job) -> dict[str, Any]:
    return {"id": job.request.id, "type": "message", "role": "assistant", "model": job.model}


def _tool_input(call: ToolCall) -> dict[str, Any]:
    raw = call.arguments.strip() or "{}"
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # A call cut short (max_tokens, a stop sequence): what it holds so far, as the SDK
        # reads the same arguments streamed.
        value = partial_value(raw) or {}
    if not isinstance(value, dict):  # the engine's parsers send objects: this is its bug
        raise EngineFailed(f"the model's call to {call.name!r} has arguments that are not a JSON object")
    return value


def message_json(job: MessagesJob, result: Result) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if result.reasoning:
        thinking = result.reasoning if job.show_thinking else ""
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    if result.text:
        content.append({"type": "text", "text": result.text})
    content += [
        {"type": "tool_use", "id": tool_use_id(c.id), "name": c.name, "input": _tool_input(c)}
        for c in result.tool_calls
    ]
    return {
        **_message_head(job),
        "content": content,
        "stop_reason": stop_reason(result.finish_reason, result.stop_sequence),
        "stop_sequence": result.stop_sequence,
        "usage": usage_json(result.usage),
        **job.context_management(),
        **job.diagnostics(result.usage),
    }


def error_json(exc: ServeError) -> dict[str, Any]:
    """Anthropic's error envelope; the status code comes from `exc.status`."""
    kind = _ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    error: dict[str, Any] = {"type": kind, "message": exc.message}
    details = getattr(exc, "details", None)  # what the SDK branches on (a thread's error_code)
    if isinstance(details, dict):
        error["details"] = details
    return {"type": "error", "error": error}


def error_body(exc: ServeError) -> bytes:
    return orjson.dumps(error_json(exc))


class MessageStream:
    """Anthropic's event grammar: message_start, ping, one content block at a time
    (start, deltas, stop), message_delta with the stop reason and usage, message_stop.

    The engine emits a turn's parts one after another (tool calls included), so exactly one
    block is open at a time.
    """

    def __init__(
        self, job: MessagesJob, on_reply: Callable[[list[dict[str, Any]]], None] | None = None
    ) -> None:
        self._job = job
        self._index = -1
        self._open: str | None = None
        self._tool_blocks: dict[int, int] = {}
        # The reply's blocks as the non-streamed message holds them, for `on_reply` at the end.
        self._on_reply = on_reply
        self._reply: list[dict[str, Any]] = []

    def start(self, admitted: Admitted | None = None) -> Frames:
        # Anthropic's message_start reports the prompt as the uncached part and the cache read
        cached = admitted.cached_tokens if admitted is not None else 0
        usage = usage_json(Usage(len(self._job.request.prompt_tokens), 0, cached_tokens=cached))
        message = {
            **_message_head(self._job),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
            **self._job.diagnostics(None),
        }
        return [_event("message_start", message=message), self.heartbeat()]

    def delta(self, event: Delta, index: int = 0) -> Frames:
        if isinstance(event, ToolCallStart):
            out = self._begin(
                "tool_use", {"type": "tool_use", "id": tool_use_id(event.id), "name": event.name, "input": {}}
            )
            self._tool_blocks[event.index] = self._index
            return out
        if isinstance(event, ToolCallArgsDelta):
            return self._tool_args(event)
        if not event.text:
            return []
        if isinstance(event, TextDelta):
            out = self._open_as("text", {"type": "text", "text": ""})
            return [*out, self._delta(self._index, {"type": "text_delta", "text": event.text})]
        out = self._open_as("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        if not self._job.show_thinking:
            return out
        return [*out, self._delta(self._index, {"type": "thinking_delta", "thinking": event.text})]

    def _open_as(self, kind: str, block: dict[str, Any]) -> Frames:
        return [] if self._open == kind else self._begin(kind, block)

    def _tool_args(self, event: ToolCallArgsDelta) -> Frames:
        index = self._tool_blocks.get(event.index)
        if index is None or not event.arguments:
            return []
        return [self._delta(index, {"type": "input_json_delta", "partial_json": event.arguments})]

    def _begin(self, kind: str, block: dict[str, Any]) -> Frames:
        out = self._close()
        self._index += 1
        self._open = kind
        if self._on_reply is not None:
            self._reply.append(dict(block))
        return [*out, _event("content_block_start", index=self._index, content_block=block)]

    def _delta(self, index: int, delta: dict[str, Any]) -> SseEvent:
        if self._on_reply is not None:
            _grow(self._reply[index], delta)
        return _event("content_block_delta", index=index, delta=delta)

    def _close(self) -> Frames:
        if self._open is None:
            return []
        self._open = None
        return [_event("content_block_stop", index=self._index)]

    def finish(self, event: Finished, index: int = 0) -> Frames:
        if self._on_reply is not None:
            self._on_reply([_settled(block) for block in self._reply])
        delta = {
            "stop_reason": stop_reason(event.reason, event.stop_sequence),
            "stop_sequence": event.stop_sequence,
        }
        return [
            *self._close(),
            _event(
                "message_delta",
                delta=delta,
                usage=usage_json(event.usage),
                **self._job.context_management(),
                **self._job.diagnostics(event.usage),
            ),
            _event("message_stop"),
        ]

    def error(self, exc: ServeError) -> Frames:
        return [SseEvent(error_json(exc), "error")]

    def heartbeat(self) -> Frame:
        return _event("ping")


def _grow(block: dict[str, Any], delta: dict[str, Any]) -> None:
    kind = delta["type"]
    if kind == "text_delta":
        block["text"] += delta["text"]
    elif kind == "thinking_delta":
        block["thinking"] += delta["thinking"]
    else:
        block["arguments"] = block.get("arguments", "") + delta["partial_json"]


def _settled(block: dict[str, Any]) -> dict[str, Any]:
    """A streamed block as the whole message holds it (a tool's input parsed)."""
    if block["type"] != "tool_use":
        return block
    call = ToolCall(block["id"], block["name"], block.get("arguments", ""))
    return {"type": "tool_use", "id": block["id"], "name": block["name"], "input": _tool_input(call)}


def _event(kind: str, **payload: Any) -> SseEvent:
    """Anthropic names each event after its payload's `type`, which comes first."""
    return SseEvent({"type": kind, **payload}, kind)
