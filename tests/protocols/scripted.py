"""A scripted engine behind a format, served to the real SDKs through a mock HTTP transport.

The SDKs then parse our bytes exactly as they parse a server's: types, SSE grammar, errors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx2
import orjson

from mlx_serve.engine.errors import ServeError
from mlx_serve.engine.types import Admitted, Event, Finished, FinishReason, TextDelta, Usage
from mlx_serve.protocols.contract import Job, ProtocolContext, WireFormat
from mlx_serve.server.writer import Accumulator, encode

Route = Callable[[httpx2.Request], tuple[int, bytes]]
SSE = "text/event-stream; charset=utf-8"


def text_events(
    *pieces: str, usage: Usage | None = None, reason: FinishReason = FinishReason.STOP
) -> list[Event]:
    return [*(TextDelta(p) for p in pieces), Finished(reason, usage or Usage(7, len(pieces)))]


def render_stream(
    fmt: WireFormat,
    job: Job,
    ctx: ProtocolContext,
    events: list[Event],
    fail: ServeError | None = None,
    admitted: Admitted | None = None,
) -> bytes:
    """What the writer sends for these events: start (told of the admission), a frame per
    event, then finish or error."""
    renderer = fmt.renderer(job, ctx)
    out = renderer.start(admitted)
    for ev in events:
        out += renderer.finish(ev) if isinstance(ev, Finished) else renderer.delta(ev)
    return encode(out + (renderer.error(fail) if fail is not None else []))


def render_json(fmt: WireFormat, job: Job, ctx: ProtocolContext, events: list[Event]) -> bytes:
    acc = Accumulator()
    for ev in events:
        if isinstance(ev, Finished):
            return fmt.to_json(job, [acc.result(ev)], ctx)
        acc.add(ev)
    raise AssertionError("events must end with Finished")


def sse_events(stream: bytes) -> list[tuple[str | None, Any]]:
    """(event name, decoded data) per frame; comments (heartbeats) are skipped."""
    assert stream.endswith(b"\n\n"), stream
    out: list[tuple[str | None, Any]] = []
    for raw in stream[:-2].split(b"\n\n"):
        if raw.startswith(b":"):
            continue
        name, data = None, None
        for line in raw.split(b"\n"):
            key, _, value = line.partition(b": ")
            if key == b"event":
                name = value.decode()
            elif key == b"data":
                data = "[DONE]" if value == b"[DONE]" else orjson.loads(value)
        out.append((name, data))
    return out


@dataclass
class ScriptedServer:
    """POST `generate_path` parses with `fmt` and answers with `events` (stream or JSON)."""

    fmt: WireFormat
    ctx: ProtocolContext
    generate_path: str
    events: list[Event] = field(default_factory=lambda: text_events("Hello", "!"))
    fail: ServeError | None = None
    admitted: Admitted | None = None  # the engine's note at admission, given to start()
    routes: dict[tuple[str, str], Route] = field(default_factory=dict)
    jobs: list[Job] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)

    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self.handle)

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        key = (request.method, request.url.path)
        route = self.routes.get(key)
        if route is None and key != ("POST", self.generate_path):
            return httpx2.Response(404, json={"error": "no route"})
        if route is not None:
            status, body = route(request)
            return httpx2.Response(status, content=body, headers={"content-type": "application/json"})
        return self._generate(request.content)

    def _generate(self, body: bytes) -> httpx2.Response:
        self.bodies.append(orjson.loads(body))
        try:
            job = self.fmt.parse(body, self.ctx)
        except ServeError as exc:
            return httpx2.Response(
                exc.status, content=self.fmt.error_body(exc), headers={"content-type": "application/json"}
            )
        self.jobs.append(job)
        notes = [("warning", w) for w in job.warnings]  # as the app sends a protocol's notes
        if job.stream:
            stream = render_stream(self.fmt, job, self.ctx, self.events, self.fail, self.admitted)
            return httpx2.Response(200, content=stream, headers=[("content-type", SSE), *notes])
        return httpx2.Response(
            200,
            content=render_json(self.fmt, job, self.ctx, self.events),
            headers=[("content-type", "application/json"), *notes],
        )
