"""The one response writer: JSON bodies, SSE and NDJSON streams, for every wire format.

It knows nothing of formats: a protocol's renderer turns engine events into frames (SSE events,
`SseComment`s, or NDJSON `JsonLine`s, as its Job's `framing` says) and this module alone writes
them as bytes.
It owns the headers, the framing, the heartbeat cadence, the end of the body and the
disconnect watch (Hypercorn's send() does not fail after a client leaves, so receive() is
watched for http.disconnect and the engine told at once). On a WebSocket (Responses over
WebSocket) the same frames go out as one text message per event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

import orjson

from mlx_serve.engine.errors import ServeError
from mlx_serve.engine.types import (
    Admitted,
    Delta,
    Finished,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallStart,
)
from mlx_serve.protocols.contract import (
    KEEP_ALIVE,
    EventStream,
    Frame,
    Framing,
    JsonLine,
    Receive,
    Result,
    Scope,
    Send,
    SseComment,
    StreamRenderer,
    ToolCall,
)

Headers = list[tuple[bytes, bytes]]
MAX_HEADER_VALUE = 512  # bytes of one header value we write; a longer one is cut, marked with "..."
SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
NDJSON_HEADERS: Headers = [
    (b"content-type", b"application/x-ndjson"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
FRAMING_HEADERS = {Framing.SSE: SSE_HEADERS, Framing.NDJSON: NDJSON_HEADERS}


def header_value(text: str | bytes) -> bytes:
    """A header value safe to write whatever the client put in it: printable ASCII only (any
    other character escaped as Python writes it, `\\x1b`, `\\u00e9`) and at most
    MAX_HEADER_VALUE bytes. A control character in a header is a protocol error (Hypercorn's
    h11 raises, after the generation ran), and a header is no place for kilobytes."""
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    safe = text.encode("ascii", "backslashreplace").decode("ascii")
    if not safe.isprintable():
        safe = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in safe)
    if len(safe) > MAX_HEADER_VALUE:
        safe = safe[: MAX_HEADER_VALUE - 3] + "..."
    return safe.encode("ascii")


def safe_headers(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    return [(name, header_value(value)) for name, value in headers]


def warning_headers(notes: Iterable[str]) -> Headers:
    """One `Warning` header per note, each made safe to write."""
    return [(b"warning", header_value(note)) for note in notes]


def encode(frames: Iterable[Frame]) -> bytes:
    """A batch of events as one SSE body chunk: the only place SSE syntax is written."""
    return b"".join([encode_frame(frame) for frame in frames])


def encode_frame(frame: Frame) -> bytes:
    if isinstance(frame, JsonLine):
        return orjson.dumps(frame.data) + b"\n"
    if isinstance(frame, SseComment):
        return _lines(b": ", frame.text) + b"\n"
    data = frame.data
    # orjson never writes a newline; literal text may span lines, each its own `data:` field.
    body = b"data: " + orjson.dumps(data) + b"\n" if isinstance(data, dict) else _lines(b"data: ", data)
    if frame.event is None:
        return body + b"\n"
    return b"event: " + frame.event.encode() + b"\n" + body + b"\n"


def _lines(field: bytes, text: str) -> bytes:
    return b"".join([field + line + b"\n" for line in text.encode().split(b"\n")])


async def send_json(
    send: Send,
    status: int,
    body: bytes,
    extra: Iterable[tuple[bytes, bytes]] = (),
    content_type: bytes = b"application/json",
) -> None:
    """A whole body in two messages (JSON unless `content_type` says otherwise)."""
    headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + safe_headers(extra)})
    await send({"type": "http.response.body", "body": body})


def watch_disconnect(receive: Receive, stream: EventStream) -> asyncio.Task[None]:
    """Cancel the engine request the moment the client goes away."""

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                stream.cancel()
                return

    return asyncio.create_task(watch())


async def collect(receive: Receive, stream: EventStream) -> list[Result] | None:
    """Run a call to the end for a JSON answer, one Result per choice; None if the client left."""
    watcher = watch_disconnect(receive, stream)
    accs = [Accumulator() for _ in stream.tickets]
    results: list[Result | None] = [None] * len(accs)
    try:
        while (item := await stream.next()) is not None:
            i, ev = item
            if isinstance(ev, Finished):
                results[i] = accs[i].result(ev)
            else:
                accs[i].add(ev)
        return [r for r in results if r is not None] if all(results) else None
    finally:
        watcher.cancel()
        stream.cancel()


class Accumulator:
    """Gathers streamed deltas into the parts of a whole answer."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, list[str]] = {}
        self.logprobs: list[TokenLogprob] = []

    def add(self, ev: Delta) -> None:
        if isinstance(ev, TextDelta):
            self.text.append(ev.text)
            self.logprobs.extend(ev.logprobs)
        elif isinstance(ev, ReasoningDelta):
            self.reasoning.append(ev.text)
        elif isinstance(ev, ToolCallStart):
            self.calls[ev.index] = [ev.id, ev.name, ""]
        else:
            self.calls[ev.index][2] += ev.arguments

    def result(self, fin: Finished) -> Result:
        calls = tuple(ToolCall(*self.calls[i]) for i in sorted(self.calls))
        return Result(
            "".join(self.text),
            fin.reason,
            fin.usage,
            fin.stop_sequence,
            "".join(self.reasoning),
            calls,
            tuple(self.logprobs),
            fin.timings,
        )


async def stream_sse(
    receive: Receive,
    send: Send,
    stream: EventStream,
    renderer: StreamRenderer,
    heartbeat_s: float,
    extra: Iterable[tuple[bytes, bytes]] = (),
    framing: Framing = Framing.SSE,
) -> None:
    """Headers at once; the renderer's first events once the engine admits the request (what the
    prefix cache served it is then known: Anthropic's message_start reports it), heartbeats
    while it waits in the queue; then one body chunk per engine event, heartbeats while quiet,
    the renderer's error events on a ServeError, and the end of the body however it ends."""
    watcher = watch_disconnect(receive, stream)
    body = _BodySender(send)
    try:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": FRAMING_HEADERS[framing] + safe_headers(extra),
            }
        )
        # before the first events, a comment where SSE has them (a format's own heartbeat, like
        # Anthropic's ping, may not come before its first event); an NDJSON format's own line
        waiting = KEEP_ALIVE if framing is Framing.SSE else renderer.heartbeat()
        admitted = await _admission(stream, body, encode_frame(waiting), heartbeat_s)
        await body(encode(renderer.start(admitted)))
        await _pump(stream, renderer, body, heartbeat_s)
    finally:
        watcher.cancel()
        stream.cancel()
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _admission(
    stream: EventStream, body: _BodySender, beat: bytes, heartbeat_s: float
) -> Admitted | None:
    """Wait for the request's admission (or its first event, its error, its end, a disconnect:
    whichever comes first), a heartbeat each `heartbeat_s` meanwhile."""
    while True:
        try:
            async with asyncio.timeout(heartbeat_s):
                return await stream.admission()
        except TimeoutError:
            await body(beat)


async def _pump(stream: EventStream, renderer: StreamRenderer, body: _BodySender, heartbeat_s: float) -> None:
    """One body chunk per wake-up: the event waited for and every event already queued behind
    it. A loop that falls behind many streams then pays a send per stream, not per token; one
    that keeps up sends each event as it comes. The heartbeat timer runs only while waiting."""
    while True:
        chunk: list[bytes] = []
        try:
            if stream.pending():
                item = await stream.next()
            else:
                async with asyncio.timeout(heartbeat_s):
                    item = await stream.next()
            while item is not None:
                i, ev = item
                chunk.append(
                    encode(renderer.finish(ev, i) if isinstance(ev, Finished) else renderer.delta(ev, i))
                )
                if not stream.pending():
                    break
                item = await stream.next()
        except TimeoutError:
            await body(encode_frame(renderer.heartbeat()))
            continue
        except ServeError as exc:
            await body(b"".join(chunk) + encode(renderer.error(exc)))
            return
        await body(b"".join(chunk))
        if item is None:
            return


# --- WebSocket messages (Responses over WebSocket) ---------------------------------------------


def websocket_text(frame: Frame) -> str | None:
    """An event's JSON as one WebSocket text message; None for what only SSE has (comments,
    the literal `[DONE]`): a socket's answer ends with its terminal event."""
    if isinstance(frame, SseComment) or isinstance(frame.data, str):
        return None
    return orjson.dumps(frame.data).decode()


async def send_websocket(send: Send, frames: Iterable[Frame]) -> None:
    for frame in frames:
        text = websocket_text(frame)
        if text is not None:
            await send({"type": "websocket.send", "text": text})


async def stream_websocket(
    send: Send, stream: EventStream, renderer: StreamRenderer, gone: asyncio.Event
) -> None:
    """One answer on an open socket: a message per event, the renderer's error events on a
    ServeError, the engine told at once when the client leaves (`gone`)."""

    async def watch() -> None:
        await gone.wait()
        stream.cancel()

    watcher = asyncio.create_task(watch())
    try:
        await send_websocket(send, renderer.start())
        while (item := await stream.next()) is not None:
            i, ev = item
            frames = renderer.finish(ev, i) if isinstance(ev, Finished) else renderer.delta(ev, i)
            await send_websocket(send, frames)
    except ServeError as exc:
        await send_websocket(send, renderer.error(exc))
    finally:
        watcher.cancel()
        stream.cancel()


async def refuse_websocket(
    scope: Scope, send: Send, status: int, body: bytes, extra: Iterable[tuple[bytes, bytes]] = ()
) -> None:
    """A handshake answered with an HTTP error in the route's envelope where the server can
    (ASGI's websocket.http.response), else closed (Hypercorn then answers 403)."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += safe_headers(extra)
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})


class _BodySender:
    def __init__(self, send: Send) -> None:
        self._send = send

    async def __call__(self, chunk: bytes) -> None:
        if chunk:
            await self._send({"type": "http.response.body", "body": chunk, "more_body": True})
