"""Per-request records: one log line, one --trace JSON line and the metrics of each request.

`RequestObserver` (ASGI middleware) opens a `RequestRecord` per HTTP request and stamps what
it sees from outside: arrival, body read, status, first and last write. The handler wraps the
engine's stream with `record_of(scope).track(stream)`; the `TrackedStream` stamps each event
(first token, gaps, finish reason, usage) and, on shutdown, ends the generation with an error.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from mlx_serve.engine.errors import EngineUnavailable, ServeError
from mlx_serve.engine.types import Admitted, EngineTimings, Finished, Usage
from mlx_serve.protocols.contract import ASGIApp, Message, Receive, Scope, Send
from mlx_serve.server.connections import OncePerInterval
from mlx_serve.server.metrics import ChoiceDone, Metrics, RequestDone
from mlx_serve.server.routes import OTHER, RouteTable, method_label
from mlx_serve.server.shutdown import Drain
from mlx_serve.server.writer import header_value

log = logging.getLogger("mlx_serve.access")
MAX_LOGGED_PARAM = 120
RECORD_KEY = "mlx_serve.record"
OBSERVER_KEY = "mlx_serve.observer"  # a WebSocket's scope: the observer its turns report to


@dataclass(slots=True)
class ChoiceTimes:
    """Token timings of one choice (one engine request) in perf_counter seconds."""

    first_token: float | None = None
    last_token: float | None = None
    gaps: list[float] = field(default_factory=list)
    deltas: int = 0
    finished_reason: str | None = None
    usage: Usage | None = None
    engine: EngineTimings | None = None

    def delta(self, now: float) -> None:
        if self.first_token is None:
            self.first_token = now
        else:
            assert self.last_token is not None
            self.gaps.append(now - self.last_token)
        self.last_token = now
        self.deltas += 1

    def done(self, arrived: float, outcome: str) -> ChoiceDone:
        tokens = self.usage.completion_tokens if self.usage else self.deltas
        ttft = None if self.first_token is None else self.first_token - arrived
        return ChoiceDone(self.finished_reason or outcome, tokens, ttft, tuple(self.gaps))


@dataclass(slots=True)
class RequestRecord:
    """What happened to one HTTP request, stamped as it happens."""

    method: str
    path: str
    client: str = ""
    arrived: float = field(default_factory=time.perf_counter)
    arrived_unix: float = field(default_factory=time.time)
    drain: Drain | None = None
    id: str = ""
    status: int = 0
    body_read: float | None = None
    submitted: float | None = None
    first_write: float | None = None
    last_write: float | None = None
    ended: float | None = None
    prompt_tokens: int = 0
    outcome: str = ""  # "", abort, error
    error: str = ""
    choices: dict[int, ChoiceTimes] = field(default_factory=dict)
    refusal: str = ""  # why an error status was answered: `not_found`, `invalid_request param=top_k`
    route: str = OTHER  # the route table's metric label
    fields: tuple[tuple[str, str], ...] = ()  # the protocol's own logfmt fields (protocols.contract.Job)
    cache_miss: str = ""  # why the prefix cache served no more of the prompt (engine.types.CacheMiss)
    probe: bool = False  # a health/metrics probe: DEBUG line, no trace line
    # The engine's notes at admission, by choice (engine.types.Admitted; the stream fills it):
    # what the prefix cache served a request that ends before its Finished does.
    admitted: dict[int, Admitted] = field(default_factory=dict)

    def track(self, stream: Any) -> TrackedStream:
        """Wrap the engine's stream for this request (refused while the server shuts down)."""
        if self.drain is not None and self.drain.draining:
            stream.cancel()
            raise EngineUnavailable("the server is shutting down; retry on another instance or later")
        self.submitted = time.perf_counter()
        self.id = stream.request.id
        self.prompt_tokens = len(stream.request.prompt_tokens)
        self.admitted = getattr(stream, "admitted", self.admitted)
        return TrackedStream(stream, self)

    def event(self, index: int, ev: Any) -> None:
        choice = self.choices.setdefault(index, ChoiceTimes())
        if isinstance(ev, Finished):
            choice.finished_reason, choice.usage, choice.engine = ev.reason.value, ev.usage, ev.timings
            if ev.usage.cache_miss is not None:
                self.cache_miss = ev.usage.cache_miss.value
        else:
            choice.delta(time.perf_counter())

    def miss(self) -> str:
        """Why the prefix cache served no more of the prompt: from the Finished usage, else
        from the admission note of a request that ended before it."""
        noted = (a.cache_miss.value for a in self.admitted.values() if a.cache_miss is not None)
        return self.cache_miss or next(noted, "")

    def refused(self, exc: ServeError) -> None:
        kind = re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()
        # the param may carry client text (a logit_bias key, a tool name): escaped and cut short
        self.refusal = kind + (
            f" param={header_value(exc.param).decode()[:MAX_LOGGED_PARAM]}" if exc.param else ""
        )

    def wrote(self, now: float) -> None:
        if self.first_write is None:
            self.first_write = now
        self.last_write = now

    def summary(self) -> RequestDone:
        end = self.ended or time.perf_counter()
        outcome = self.outcome or "abort"
        choices = tuple(c.done(self.arrived, outcome) for _, c in sorted(self.choices.items()))
        if self.submitted is not None and not choices:
            choices = (ChoiceTimes().done(self.arrived, outcome),)
        # a choice that ended before its Finished (the client left) still has its admission note
        finished = [c.usage.cached_tokens for c in self.choices.values() if c.usage]
        cached = max(finished + [a.cached_tokens for a in self.admitted.values()], default=0)
        return RequestDone(
            self.route,
            method_label(self.method),
            self.status or (499 if self.outcome == "abort" else 500),
            end - self.arrived,
            self.prompt_tokens,
            cached,
            choices,
        )


class TrackedStream:
    """The engine's RequestStream as the writer sees it, with each event stamped on the record."""

    def __init__(self, stream: Any, record: RequestRecord) -> None:
        self._stream = stream
        self._record = record
        self._ended_by_shutdown = False
        self._closed = False
        if record.drain is not None:
            record.drain.add(self)

    def __getattr__(self, name: str) -> Any:
        # Everything else (request, tickets, done, warnings, ...) is the engine stream's own.
        return getattr(self._stream, name)

    async def next(self) -> Any:
        try:
            item = await self._stream.next()
        except ServeError as exc:
            self._close("error", exc.message)
            raise
        if item is None:
            return self._ended()
        self._record.event(*item)
        if self._stream.done:
            self._close("")
        return item

    def _ended(self) -> None:
        if self._ended_by_shutdown:
            self._close("abort", "server shutdown")
            raise EngineUnavailable("the server is shutting down; this generation was ended")
        self._close("abort", "client went away")

    def cancel(self) -> None:
        self._stream.cancel()
        self._close("abort", "client went away")

    def end_for_shutdown(self) -> None:
        """Stop the generation; the consumer's next() raises EngineUnavailable."""
        self._ended_by_shutdown = True
        self._stream.cancel()

    def _close(self, outcome: str, error: str = "") -> None:
        if self._closed:
            return
        self._closed = True
        self._record.outcome, self._record.error = outcome, error
        if self._record.drain is not None:
            self._record.drain.discard(self)


class TraceWriter:
    """--trace FILE: one JSON line per request with its phase timings (seconds from arrival).

    A line is written whole or not at all: one that cannot be (a full disk, a file-size limit)
    is cut back off the file and counted in `dropped`, the cause logged once a minute, never a
    traceback per request; writing resumes when it can."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.dropped = 0
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._torn = False  # a part-line that could not be cut off ends the file
        self._say = OncePerInterval(log)

    def write(self, record: RequestRecord, done: RequestDone) -> None:
        self._append(orjson.dumps(trace_line(record, done)) + b"\n")

    def _append(self, line: bytes) -> None:
        start = -1
        try:
            start = os.lseek(self._fd, 0, os.SEEK_END)
            view = memoryview(b"\n" + line if self._torn else line)
            while view:
                view = view[os.write(self._fd, view) :]
            self._torn = False
        except OSError as exc:
            self.dropped += 1
            self._torn = start >= 0 and not _cut(self._fd, start)
            self._say(
                "trace", "--trace %s: %d lines dropped so far: %s", self.path, self.dropped, exc.strerror
            )

    def close(self) -> None:
        os.close(self._fd)


def _cut(fd: int, size: int) -> bool:
    """The file back to `size` bytes (dropping a part-written line); False if it cannot be."""
    try:
        os.ftruncate(fd, size)
        return True
    except OSError:
        return False


def _since(record: RequestRecord, t: float | None) -> float | None:
    return None if t is None else round(t - record.arrived, 6)


def trace_line(record: RequestRecord, done: RequestDone) -> dict[str, Any]:
    firsts = [c.first_token for c in record.choices.values() if c.first_token is not None]
    lasts = [c.last_token for c in record.choices.values() if c.last_token is not None]
    gaps = [g for c in record.choices.values() for g in c.gaps]
    phases = {
        "body_read": _since(record, record.body_read),
        "submitted": _since(record, record.submitted),
        "first_token": _since(record, min(firsts, default=None)),
        "last_token": _since(record, max(lasts, default=None)),
        "first_write": _since(record, record.first_write),
        "last_write": _since(record, record.last_write),
        "end": _since(record, record.ended),
    }
    return {
        "id": record.id,
        "method": record.method,
        "route": record.route,
        "status": done.status,
        "outcome": outcome_of(done),
        "error": record.error or None,
        "arrived_unix": record.arrived_unix,
        "phases_s": phases,
        "prompt_tokens": done.prompt_tokens,
        "cached_tokens": done.cached_tokens,
        "completion_tokens": sum(c.completion_tokens for c in done.choices),
        "choices": len(done.choices),
        "engine_s": [_engine_phases(c.engine, record.arrived) for _, c in sorted(record.choices.items())],
        "inter_token_s": {
            "n": len(gaps),
            "mean": round(sum(gaps) / len(gaps), 6) if gaps else None,
            "max": round(max(gaps), 6) if gaps else None,
        },
    }


def _engine_phases(t: EngineTimings | None, arrived: float) -> dict[str, Any] | None:
    """Admission wait, prefill chunks, first token and finish, from the engine's own clock
    (seconds from when the engine took the request in: `engine_in`, seconds after its arrival)."""
    if t is None:
        return None
    engine_in = None if t.arrived_at is None else round(t.arrived_at - arrived, 6)
    return {
        "engine_in": engine_in,
        "admission_wait": t.admitted_s,
        "prefill_chunks": [list(c) for c in t.prefill_chunks],
        "first_token": t.first_token_s,
        "first_delta": t.first_delta_s,
        "finished": t.finished_s,
    }


def outcome_of(done: RequestDone) -> str:
    return ",".join(sorted({c.finished_reason for c in done.choices})) or "-"


def log_line(record: RequestRecord, done: RequestDone) -> str:
    """One logfmt line: id, route, status, tokens, TTFT, duration."""
    ttfts = [c.ttft_s for c in done.choices if c.ttft_s is not None]
    ttft = f"{min(ttfts) * 1000:.1f}" if ttfts else "-"
    completion = sum(c.completion_tokens for c in done.choices)
    return (
        f"request id={record.id} method={record.method} route={record.route} status={done.status} "
        f"finish={outcome_of(done)} prompt_tokens={done.prompt_tokens} completion_tokens={completion} "
        f"cached_tokens={done.cached_tokens} ttft_ms={ttft} duration_ms={done.duration_s * 1000:.1f} "
        f"client={record.client or '-'}"
        + (f" cache_miss={miss}" if (miss := record.miss()) else "")
        + "".join(f" {k}={v}" for k, v in record.fields)
        + (f" error={record.refusal}" if record.refusal else "")
    )


def record_of(scope: Scope) -> RequestRecord:
    """The request's record, or a detached one when no RequestObserver is in front of the app."""
    record = scope.get(RECORD_KEY)
    if not isinstance(record, RequestRecord):
        record = scope[RECORD_KEY] = RequestRecord(scope.get("method", ""), scope.get("path", ""))
    return record


def socket_turn(scope: Scope, route: str) -> RequestRecord:
    """The record of one turn on a WebSocket (method `WS`): its own log line, metrics, trace."""
    observer = scope.get(OBSERVER_KEY)
    drain = observer.drain if isinstance(observer, RequestObserver) else None
    return RequestRecord("WS", scope.get("path", ""), _client(scope), drain=drain, route=route)


def report_turn(scope: Scope, record: RequestRecord) -> None:
    record.ended = time.perf_counter()
    observer = scope.get(OBSERVER_KEY)
    if isinstance(observer, RequestObserver):
        observer.report(record)


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else ""


class Watcher:
    """Told of each request as it begins and ends (the page's list of recent requests)."""

    def begin(self, record: RequestRecord) -> None:
        """A request arrived (its record is stamped as it goes on)."""

    def end(self, record: RequestRecord, done: RequestDone) -> None:
        """A request ended, with its summary."""


class RequestObserver:
    """ASGI middleware: a record per request; at its end a log line, a trace line, metrics."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        drain: Drain | None = None,
        trace: TraceWriter | None = None,
        table: RouteTable | None = None,
        watcher: Watcher | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.drain = drain
        self.trace = trace
        self.watcher = watcher
        self.table = table if table is not None else getattr(app, "table", None)
        self._unavailable_said = False  # a 503 while the engine loads or restarts was logged at INFO

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "websocket":
                scope[OBSERVER_KEY] = self  # each turn on it is a request of its own (socket_turn)
            await self.app(scope, receive, send)
            return
        record = RequestRecord(scope["method"], scope["path"], _client(scope), drain=self.drain)
        if self.table is not None:
            match = self.table.match_scope(scope)
            record.route = match.label
            record.probe = match.route is not None and match.route.probe
        scope[RECORD_KEY] = record
        if self.watcher is not None:
            self.watcher.begin(record)

        async def observed_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                record.body_read = time.perf_counter()
            return message

        async def observed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                record.status = message["status"]
            elif message["type"] == "http.response.body":
                record.wrote(time.perf_counter())
            await send(message)

        try:
            await self.app(scope, observed_receive, observed_send)
        finally:
            record.ended = time.perf_counter()
            self.report(record)

    def _repeat_unavailable(self, record: RequestRecord) -> bool:
        """Whether this is another 503 while the engine is not ready: clients poll while a model
        loads, so the first is logged and the rest at DEBUG, until an answer of another kind."""
        if record.refusal != "engine_unavailable":
            if not record.probe:
                self._unavailable_said = False
            return False
        said, self._unavailable_said = self._unavailable_said, True
        return said

    def report(self, record: RequestRecord) -> None:
        record.id = record.id or f"req-{uuid.uuid4().hex[:16]}"
        done = record.summary()
        self.metrics.observe(done)
        if self.watcher is not None:
            self.watcher.end(record, done)
        quiet = record.probe or self._repeat_unavailable(record)
        log.log(logging.DEBUG if quiet else logging.INFO, "%s", log_line(record, done))
        if self.trace is not None and not quiet:
            self.trace.write(record, done)
