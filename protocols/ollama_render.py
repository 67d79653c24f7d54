"""Ollama's answers: the NDJSON stream of /api/chat and /api/generate, their whole-body answers
and the error shape, `{"error": "..."}`.

A streamed line carries a piece of the answer (`message.content` for chat, `response` for
generate; reasoning under `thinking`) with `done: false`; the last line has `done: true`, the
`done_reason` and the counts and durations (nanoseconds). Tool calls come whole, with their
arguments as a JSON object, in a line of their own before the last. While the engine is quiet
the writer's heartbeat is a line with no text, which clients append as nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from mlx_serve.engine.errors import ServeError
from mlx_serve.engine.types import (
    Admitted,
    Delta,
    EngineTimings,
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from mlx_serve.protocols.contract import Frame, Frames, Job, JsonLine, ProtocolContext, Result, ToolCall

NANOS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class OllamaJob(Job):
    """An Ollama call: `chat` (else generate), the model name to echo, when it arrived (unix s)."""

    chat: bool = True
    echo: str = ""
    arrived: float = 0.0


def own(job: Job) -> OllamaJob:
    assert isinstance(job, OllamaJob), "an Ollama route renders the job its parse made"
    return job


def created_at() -> str:
    """RFC 3339 in UTC with microseconds, as Ollama writes it."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def error_body(exc: ServeError) -> bytes:
    return orjson.dumps({"error": exc.message})


def head(job: OllamaJob) -> dict[str, Any]:
    return {"model": job.echo, "created_at": created_at()}


def piece(
    job: OllamaJob, text: str = "", thinking: str = "", calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """One line's answer part: chat's `message`, or generate's `response` (and `thinking`)."""
    if job.chat:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = calls
        return {"message": message}
    return {"response": text, "thinking": thinking} if thinking else {"response": text}


def done_fields(
    job: OllamaJob, reason: FinishReason, usage: Usage, timings: EngineTimings | None
) -> dict[str, Any]:
    prefill = sum(s for _, s in timings.prefill_chunks) if timings else 0.0
    first = timings.first_token_s if timings and timings.first_token_s is not None else None
    decode = timings.finished_s - first if timings and first is not None else 0.0
    return {
        "done": True,
        # Ollama ends a turn of tool calls with "stop" too.
        "done_reason": "length" if reason is FinishReason.LENGTH else "stop",
        "total_duration": _nanos(time.time() - job.arrived),
        "load_duration": 0,
        "prompt_eval_count": usage.prompt_tokens,
        "prompt_eval_duration": _nanos(prefill),
        "eval_count": usage.completion_tokens,
        "eval_duration": _nanos(decode),
    }


def _nanos(seconds: float) -> int:
    return max(int(seconds * NANOS), 0)


def call_json(call: ToolCall, index: int) -> dict[str, Any]:
    """A tool call as Ollama writes it: the arguments a JSON object, not text."""
    try:
        arguments = orjson.loads(call.arguments) if call.arguments.strip() else {}
    except orjson.JSONDecodeError:
        arguments = call.arguments  # what the model wrote, rather than nothing
    return {"id": call.id, "function": {"index": index, "name": call.name, "arguments": arguments}}


def logprobs_json(entries: tuple[TokenLogprob, ...]) -> list[dict[str, Any]]:
    return [
        {
            "token": t.token,
            "logprob": t.logprob,
            "top_logprobs": [{"token": tok, "logprob": lp} for tok, lp in t.top],
        }
        for t in entries
    ]


def loaded(job: OllamaJob) -> bytes:
    """The answer to a call with no prompt (how Ollama clients load a model)."""
    return orjson.dumps({**head(job), **piece(job), "done": True, "done_reason": "load"})


def whole(job: OllamaJob, result: Result) -> bytes:
    calls = [call_json(c, i) for i, c in enumerate(result.tool_calls)]
    body = {
        **head(job),
        **piece(job, result.text, result.reasoning, calls),
        **done_fields(job, result.finish_reason, result.usage, result.timings),
    }
    if job.request.logprobs is not None:
        body["logprobs"] = logprobs_json(result.logprobs)
    return orjson.dumps(body)


class OllamaStream:
    """NDJSON lines for one streamed call; tool calls are held until whole."""

    def __init__(self, job: OllamaJob) -> None:
        self._job = job
        self._calls: dict[int, ToolCall] = {}

    def _line(self, **part: Any) -> JsonLine:
        return JsonLine({**head(self._job), **piece(self._job, **part), "done": False})

    def start(self, admitted: Admitted | None = None) -> Frames:
        return []

    def delta(self, event: Delta, index: int = 0) -> Frames:
        if isinstance(event, ToolCallStart):
            held = self._flush()
            self._calls[event.index] = ToolCall(event.id, event.name, "")
            return held
        if isinstance(event, ToolCallArgsDelta):
            call = self._calls[event.index]
            self._calls[event.index] = ToolCall(call.id, call.name, call.arguments + event.arguments)
            return []
        if isinstance(event, ReasoningDelta):
            return [*self._flush(), self._line(thinking=event.text)] if event.text else []
        if not isinstance(event, TextDelta) or not (event.text or event.logprobs):
            return []
        line = self._line(text=event.text)
        if self._job.request.logprobs is not None:
            line.data["logprobs"] = logprobs_json(event.logprobs)
        return [*self._flush(), line]

    def _flush(self) -> Frames:
        if not self._calls:
            return []
        calls = [call_json(self._calls[i], i) for i in sorted(self._calls)]
        self._calls = {}
        return [self._line(calls=calls)]

    def finish(self, event: Finished, index: int = 0) -> Frames:
        last = {
            **head(self._job),
            **piece(self._job),
            **done_fields(self._job, event.reason, event.usage, event.timings),
        }
        return [*self._flush(), JsonLine(last)]

    def error(self, exc: ServeError) -> Frames:
        return [JsonLine({"error": exc.message})]

    def heartbeat(self) -> Frame:
        return self._line()


def to_json(job: Job, results: list[Result], ctx: ProtocolContext) -> bytes:
    return whole(own(job), results[0])
