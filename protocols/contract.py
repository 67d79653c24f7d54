"""The wire contract: what the server and the protocol modules agree on.

Both sides import this module; it imports neither (only engine types). It holds the ASGI
aliases, the job a protocol hands the server, the whole-answer record, the renderer and format
interfaces, and the HTTP-level errors (the engine's own live in engine.errors).
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from mlx_serve.engine.errors import ServeError
from mlx_serve.engine.model.facts import ModelFacts
from mlx_serve.engine.model.tokenizer import ChatTokenizer
from mlx_serve.engine.types import (
    Admitted,
    Delta,
    EngineTimings,
    Event,
    Finished,
    FinishReason,
    Request,
    SamplingParams,
    TokenLogprob,
    Usage,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class NotFound(ServeError):
    status = 404


class ModelNotFound(NotFound):
    """A model name this server does not serve (OpenAI's error code `model_not_found`)."""


class MethodNotAllowed(ServeError):
    status = 405


class PayloadTooLarge(ServeError):
    status = 413


class Unauthorized(ServeError):
    status = 401


class ClientGone(ServeError):
    """The client left before its request was read: nobody to answer; logged as 499."""

    status = 499


@dataclass(frozen=True, slots=True)
class Defaults:
    """Server-wide defaults a request falls back to: the engine's sampling defaults with the
    server's --temp, --top-p, --top-k, --min-p over them, --max-tokens, --chat-template-args,
    the reasoning budget."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 512
    chat_template_args: dict[str, Any] | None = None
    # --reasoning-budget (None or -1: unbounded) and --reasoning-budget-message (protocols.reasoning)
    reasoning_budget: int | None = None
    reasoning_budget_message: str = ""

    def sampling_for(self, **given: Any) -> SamplingParams:
        """The one resolver: each sampling field the request gave (None: absent) over these
        defaults, in the engine's conventions (mlx-lm's "off" values top_p 0, top_k -1 → 1.0, 0)."""
        chosen = replace(self.sampling, **{k: v for k, v in given.items() if v is not None})
        return replace(chosen, top_p=chosen.top_p if chosen.top_p > 0 else 1.0, top_k=max(chosen.top_k, 0))


@dataclass(frozen=True, slots=True)
class ProtocolContext:
    """What a protocol module may know about the server: never sockets, never MLX."""

    model_id: str
    tokenizer: ChatTokenizer
    defaults: Defaults
    created: int
    # The longest prompt + answer a request may use (the memory plan's); None: not known.
    context_length: int | None = None
    # Who is asking: a digest of the API key the request carried ("" on a server without keys).
    # Stored responses are kept per principal: one key cannot read or continue another's.
    principal: str = ""
    # The names the model is served under: those listed, and the check of any name.
    listed: tuple[str, ...] = ()
    accepts: Callable[[str], bool] | None = None
    # An embedding model's vector size (it serves embeddings only); None: a generation model.
    dimensions: int | None = None
    # Its size on disk and in memory, parameters and quantization (Ollama's listings); None: unknown.
    facts: ModelFacts | None = None
    # The LoRA adapter folder the model is served with (--adapter-path, or a `base:NAME` model).
    adapter: str | None = None
    # Claude Code's `x-anthropic-billing-header` system block reaches the prompt (--keep-billing-header).
    keep_billing_header: bool = False
    # The `anthropic-beta` header's names (a beta a body cannot name: cache-diagnosis-2026-04-07).
    betas: frozenset[str] = frozenset()

    def room_after(self, prompt_tokens: int) -> int:
        """What an answer may run to when the request sets no limit: the context that remains
        (at least 1, so admission, not this, refuses a prompt that fills the context);
        the server's --max-tokens when the context is not known."""
        if self.context_length is None:
            return self.defaults.max_tokens
        return max(self.context_length - prompt_tokens, 1)


class Framing(enum.Enum):
    """How the writer frames a stream: server-sent events, or one JSON object a line (Ollama)."""

    SSE = "sse"
    NDJSON = "ndjson"


@dataclass(frozen=True, slots=True)
class Job:
    """A parsed API call: the engine request plus how the client wants the answer.

    `prompts` holds the prompts after the first when one call asks for several (the legacy
    completions API): each gets `n` choices, in order. `warnings` are `Warning` header values
    the protocol adds (a tool it cannot offer, a template without tool support). `framing` is
    how a streamed answer is framed; `answer` a whole body the format gives without running
    the engine (Ollama's load probe: an empty prompt), sent as is. `log_fields` are added to
    the request's access log line.
    """

    request: Request
    stream: bool
    include_usage: bool = False
    model: str = ""
    n: int = 1
    prompts: tuple[tuple[int, ...], ...] = ()
    warnings: tuple[str, ...] = ()
    framing: Framing = Framing.SSE
    answer: bytes | None = None
    # logfmt fields the access log line adds (Anthropic's cache_miss_reason).
    log_fields: tuple[tuple[str, str], ...] = ()

    @property
    def choices(self) -> int:
        return self.n * (1 + len(self.prompts))


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Result:
    """A whole non-streamed generation."""

    text: str
    finish_reason: FinishReason
    usage: Usage
    stop_sequence: str | None = None
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()
    timings: EngineTimings | None = None


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One server-sent event: `data` a JSON payload, or literal text (OpenAI's `[DONE]`);
    `event` its name where the format names events (Anthropic, Responses)."""

    data: dict[str, Any] | str
    event: str | None = None


@dataclass(frozen=True, slots=True)
class SseComment:
    """A comment line clients skip: what keeps a quiet stream alive through proxies."""

    text: str


@dataclass(frozen=True, slots=True)
class JsonLine:
    """One line of an NDJSON stream: a JSON object, then a newline."""

    data: dict[str, Any]


Frame = SseEvent | SseComment | JsonLine
Frames = list[Frame]
KEEP_ALIVE = SseComment("keep-alive")


class EventStream(Protocol):
    """What the writer needs of an engine stream (RequestStream, observe.TrackedStream)."""

    @property
    def tickets(self) -> Sequence[Any]: ...
    async def next(self) -> tuple[int, Event] | None: ...
    def pending(self) -> int:
        """How many items next() would give without waiting."""
        ...

    async def admission(self) -> Admitted | None:
        """Wait for the first choice's admission to a row: the engine's note of what the prefix
        cache served it; None when an event, an error or the end comes first."""
        ...

    def cancel(self) -> None: ...


class StreamRenderer(Protocol):
    """Turns engine events into one wire format's SSE events; the writer frames and sends them."""

    def start(self, admitted: Admitted | None = None) -> Frames:
        """The stream's first events, sent once the request is admitted to a row: `admitted`
        says what the prefix cache served it (None: not known, the stream ended or failed
        first). A format whose first event reports usage (Anthropic's message_start) uses it."""
        ...

    def delta(self, event: Delta, index: int = 0) -> Frames: ...
    def finish(self, event: Finished, index: int = 0) -> Frames:
        """One choice ended; with n choices, the format closes the stream after the last."""
        ...

    def error(self, exc: ServeError) -> Frames:
        """The in-band error after headers, with the format's terminal events."""
        ...

    def heartbeat(self) -> Frame:
        """What the writer sends while the engine is quiet."""
        ...


class WireFormat(Protocol):
    """One protocol module's face towards the server."""

    def parse(self, body: bytes, ctx: ProtocolContext) -> Job: ...
    def renderer(self, job: Job, ctx: ProtocolContext) -> StreamRenderer: ...
    def to_json(self, job: Job, results: list[Result], ctx: ProtocolContext) -> bytes:
        """The whole answer: one Result per choice (a single one unless the format has `n`)."""
        ...

    def error_body(self, exc: ServeError) -> bytes: ...


class ErrorFormat(Protocol):
    """How one wire format spells an error body (OpenAI's envelope, Anthropic's)."""

    def error_body(self, exc: ServeError) -> bytes: ...


Handler = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Route:
    """One endpoint: dispatch, auth, metrics and the trace all read this entry.

    `path` may hold parameters (`/v1/models/{model_id}`), found in `scope["path_params"]`;
    `label` names the metric series (the path pattern unless said); `open` routes need no key
    (the server's flags may still protect /health and /metrics); `probe` routes log at DEBUG
    and write no trace line.
    """

    method: str
    path: str
    handler: Handler
    errors: ErrorFormat
    label: str = ""
    open: bool = False
    probe: bool = False

    @property
    def metric_label(self) -> str:
        return self.label or self.path
