"""What the OpenAI formats (and the Anthropic and Responses ones, where they match) render alike.

The error envelope, the usage object and its speculation extension, the head of every response
object, chat logprob entries, and the chunk sequence a stream sends. The request side is
protocols.openai_common.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from mlx_serve.engine.errors import ContextTooLong, InvalidRequest, QueueFull, ServeError
from mlx_serve.engine.types import TokenLogprob, Usage
from mlx_serve.protocols.contract import (
    KEEP_ALIVE,
    Frame,
    Frames,
    Job,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    PayloadTooLarge,
    ProtocolContext,
    SseEvent,
    Unauthorized,
)

DONE = SseEvent("[DONE]")


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "accepted_prediction_tokens": usage.accepted_tokens if usage.predicted else 0,
            "rejected_prediction_tokens": usage.drafted_tokens - usage.accepted_tokens
            if usage.predicted
            else 0,
        },
        **speculation_json(usage),
    }


def speculation_json(usage: Usage) -> dict[str, Any]:
    """The `speculation` usage extension, present when the request's tokens were speculated."""
    if not usage.drafted_tokens:
        return {}
    return {
        "speculation": {
            "drafted": usage.drafted_tokens,
            "accepted": usage.accepted_tokens,
            "acceptance_rate": round(usage.accepted_tokens / usage.drafted_tokens, 4),
        }
    }


def system_fingerprint(model_id: str) -> str:
    """Stable per served model, in OpenAI's `fp_<hex>` shape."""
    return "fp_" + hashlib.blake2b(model_id.encode(), digest_size=5).hexdigest()


def response_head(job: Job, ctx: ProtocolContext, object_type: str) -> dict[str, Any]:
    """The fields every response object and stream chunk starts with, in OpenAI's order."""
    return {
        "id": job.request.id,
        "object": object_type,
        "created": ctx.created,
        "model": job.model or ctx.model_id,
        "system_fingerprint": system_fingerprint(ctx.model_id),
    }


def error_json(exc: ServeError) -> dict[str, Any]:
    """OpenAI's error envelope; the status code comes from `exc.status`."""
    kind, code = _error_kind(exc)
    return {"error": {"message": exc.message, "type": kind, "param": exc.param, "code": code}}


def _error_kind(exc: ServeError) -> tuple[str, str | None]:
    # OpenAI answers bad keys, unknown routes and models with "invalid_request_error" too.
    if isinstance(exc, ContextTooLong):
        return "invalid_request_error", "context_length_exceeded"
    if isinstance(exc, Unauthorized):
        return "invalid_request_error", "invalid_api_key"
    if isinstance(exc, QueueFull):
        return "requests", "rate_limit_exceeded"
    if isinstance(exc, ModelNotFound):
        return "invalid_request_error", "model_not_found"
    if isinstance(exc, InvalidRequest | NotFound | MethodNotAllowed | PayloadTooLarge):
        return "invalid_request_error", None
    return "server_error", None


def error_body(exc: ServeError) -> bytes:
    return orjson.dumps(error_json(exc))


def token_logprob_json(t: TokenLogprob) -> dict[str, Any]:
    """OpenAI chat's `logprobs.content[]` entry."""
    return {
        "token": t.token,
        "logprob": t.logprob,
        "bytes": list(t.token.encode()),
        "top_logprobs": [{"token": s, "logprob": v, "bytes": list(s.encode())} for s, v in t.top],
    }


def combined_usage(usages: list[Usage], n: int = 1) -> Usage:
    """One call's usage over its choices, `n` per prompt in prompt order: each prompt counted
    once, completions summed."""
    first, leaders = usages[0], usages[::n]
    return Usage(
        sum(u.prompt_tokens for u in leaders),
        sum(u.completion_tokens for u in usages),
        sum(u.cached_tokens for u in leaders),
        sum(u.drafted_tokens for u in usages),
        sum(u.accepted_tokens for u in usages),
        first.predicted,
    )


class ChunkStream:
    """The chunk sequence both formats stream; subclasses shape each choice.

    With `include_usage` every chunk carries `"usage": null` and a last chunk with no choices
    carries the usage, as OpenAI sends them. With several choices (`n` per prompt, `choices` in
    all), the usage chunk and the terminator follow the last choice's finish chunk.
    """

    def __init__(
        self, head: dict[str, Any], include_usage: bool, n: int = 1, choices: int | None = None
    ) -> None:
        self._head = head
        self._include_usage = include_usage
        self._n = n
        self._choices = n if choices is None else choices
        self._usages: dict[int, Usage] = {}

    def frame(self, choice: dict[str, Any]) -> SseEvent:
        chunk = {**self._head, "choices": [choice]}
        if self._include_usage:
            chunk["usage"] = None
        return SseEvent(chunk)

    def closing(self, choice: dict[str, Any], usage: Usage, index: int = 0) -> Frames:
        """A choice's finishing chunk; after the last choice, the usage chunk and terminator."""
        out: Frames = [self.frame(choice)]
        self._usages[index] = usage
        if len(self._usages) < self._choices:
            return out
        if self._include_usage:
            usages = [self._usages[i] for i in sorted(self._usages)]
            total = usage_json(combined_usage(usages, self._n))
            out.append(SseEvent({**self._head, "choices": [], "usage": total}))
        out.append(DONE)
        return out

    def error(self, exc: ServeError) -> Frames:
        return [SseEvent(error_json(exc)), DONE]

    def heartbeat(self) -> Frame:
        return KEEP_ALIVE
