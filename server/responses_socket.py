"""Responses over WebSocket: GET /v1/responses upgraded, as Codex prefers it.

On one open socket the client sends `response.create` messages (a POST /v1/responses body with
`"type": "response.create"`; `stream` is implied) and gets back, one text message each, the
events the SSE stream would carry, ending with `response.completed` (or `.incomplete`,
`.failed`). Turns run one after another; each may continue the last with
`previous_response_id`, which the same ResponsesStore serves as over HTTP; `generate: false`
(Codex's prewarm) completes at once with no output. A turn refused before it starts gets
Responses' WebSocket `error` event (`status`, and the error object of the HTTP answer; an
unknown previous response is `previous_response_not_found`) and the socket stays open; a
client that leaves mid-answer stops its engine request at once. Keys, validation, limits and the access log are those of HTTP: each turn is
one access log line (method `WS`).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from mlx_serve.engine.errors import InvalidRequest, ServeError
from mlx_serve.engine.types import Finished, FinishReason, Request, Usage
from mlx_serve.protocols.contract import (
    EventStream,
    Frames,
    Job,
    Message,
    NotFound,
    ProtocolContext,
    Receive,
    Scope,
    Send,
    SseEvent,
    StreamRenderer,
    WireFormat,
)
from mlx_serve.protocols.openai_responses import OpenAIResponses
from mlx_serve.server.observe import RequestRecord, report_turn, socket_turn
from mlx_serve.server.registry import Slot
from mlx_serve.server.writer import send_websocket, stream_websocket

CREATE = "response.create"
QUEUED_TURNS = 16  # turns a client may send ahead of the one running; past it the socket closes
# Fields a socket's turn does not take: the socket streams every answer.
TRANSPORT_ONLY = ("stream", "background")


class Generator(Protocol):
    """What a socket needs of the app: the same preparation and engine as HTTP's route."""

    def model_for(self, body: bytes) -> contextlib.AbstractAsyncContextManager[Slot]: ...
    def context(self, scope: Scope | None = None, slot: Slot | None = None) -> ProtocolContext: ...
    async def prepare(
        self, fmt: WireFormat, body: bytes, ctx: ProtocolContext, slot: Slot | None = None
    ) -> tuple[Job, list[Request]]: ...
    def submit(self, requests: list[Request], slot: Slot | None = None) -> EventStream: ...


class Inbox:
    """The client's messages, read as they come (so a client that leaves is seen at once, even
    mid-answer); `gone` is set when it leaves."""

    def __init__(self, receive: Receive) -> None:
        self.gone = asyncio.Event()
        self.close_code = 1000  # 1008 (policy) when it sent too many turns ahead
        self._queue: asyncio.Queue[Message] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read(receive))

    async def _read(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                self.gone.set()
                await self._queue.put(message)
                return
            if self._queue.qsize() >= QUEUED_TURNS:
                # A client that sends turns faster than they run: refused as one that left.
                self.gone.set()
                self.close_code = 1008
                await self._queue.put({"type": "websocket.disconnect", "code": 1008})
                return
            await self._queue.put(message)

    async def next_text(self) -> str | bytes | None:
        """The next message's payload; None once the client has left."""
        message = await self._queue.get()
        if message["type"] != "websocket.receive":
            return None
        text = message.get("text")
        return text if text is not None else message.get("bytes") or b""

    def close(self) -> None:
        self._reader.cancel()


@dataclass(frozen=True, slots=True)
class Turn:
    """A `response.create` message: the body POST /v1/responses takes, and whether to generate
    (`generate: false`, Codex's prewarm: the response completes at once with no output)."""

    body: bytes
    generate: bool = True


def turn_of(payload: str | bytes) -> Turn:
    """A client message as a turn; InvalidRequest, naming the field, for anything else."""
    try:
        event = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"a WebSocket message must be a JSON object: {exc}") from exc
    if not isinstance(event, dict):
        raise InvalidRequest("a WebSocket message must be a JSON object")
    kind = event.pop("type", None)
    if kind != CREATE:
        raise InvalidRequest(
            f"unknown client event type {kind!r}: this server takes {CREATE!r}", param="type"
        )
    if event.get("background"):
        raise InvalidRequest("`background` is not supported over WebSocket", param="background")
    generate = event.pop("generate", True)
    if not isinstance(generate, bool):
        raise InvalidRequest("`generate` must be a boolean", param="generate")
    for field in TRANSPORT_ONLY:
        event.pop(field, None)
    event["stream"] = True
    return Turn(orjson.dumps(event), generate)


def error_event(fmt: WireFormat, exc: ServeError) -> dict[str, Any]:
    """Responses' WebSocket `error` event: the HTTP answer's status and error object."""
    body = orjson.loads(fmt.error_body(exc))
    if (
        isinstance(exc, NotFound)
        and exc.param == "previous_response_id"
        and isinstance(body.get("error"), dict)
    ):
        # WebSocket mode's code for it: the client then resends the whole conversation.
        body["error"]["code"] = "previous_response_not_found"
    return {"type": "error", "status": exc.status, **body}


class ResponsesSocket:
    """One upgraded connection: accept, then answer each `response.create` in turn. The
    connection keeps its own recent responses (OpenAIResponses.on_socket), so a turn continues
    the last even when it was not stored."""

    def __init__(self, app: Generator, fmt: OpenAIResponses, route: str) -> None:
        self.app = app
        self.fmt = fmt.on_socket()
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        inbox = Inbox(receive)
        try:
            while (payload := await inbox.next_text()) is not None:
                record = socket_turn(scope, self.route)
                try:
                    await self.turn(scope, payload, send, inbox, record)
                finally:
                    report_turn(scope, record)
        finally:
            inbox.close()
            with contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": inbox.close_code})

    async def turn(
        self, scope: Scope, payload: str | bytes, send: Send, inbox: Inbox, record: RequestRecord
    ) -> None:
        async with contextlib.AsyncExitStack() as held:  # the turn's model, held until it ends
            try:
                turn = turn_of(payload)
                slot = await held.enter_async_context(self.app.model_for(turn.body))
                ctx = self.app.context(scope, slot)
                job, requests = await self.app.prepare(self.fmt, turn.body, ctx, slot)
                record.fields += job.log_fields
                if not turn.generate:
                    record.id, record.status = job.request.id, 200
                    await send_websocket(send, _without_output(self.fmt.renderer(job, ctx), job))
                    return
                stream = record.track(self.app.submit(requests, slot))
            except ServeError as exc:
                record.refused(exc)
                record.status = exc.status
                await send_websocket_event(send, error_event(self.fmt, exc))
                return
            record.status = 200
            await stream_websocket(send, stream, self.fmt.renderer(job, ctx), inbox.gone)


def _without_output(renderer: StreamRenderer, job: Job) -> Frames:
    """A response that completes at once with no output (kept as any other when stored, so a
    turn may continue from it)."""
    usage = Usage(len(job.request.prompt_tokens), 0)
    return [*renderer.start(), *renderer.finish(Finished(FinishReason.STOP, usage))]


async def send_websocket_event(send: Send, event: dict[str, Any]) -> None:
    await send_websocket(send, [SseEvent(event)])
