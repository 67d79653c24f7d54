"""A streaming request for a model that is not loaded yet: its SSE head goes out at once and a
keep-alive comment every --heartbeat-s while the model loads (tens of seconds for a big one), so
no client times out; the answer then follows in the same stream. A refusal found after the head
(the model failed to load, or the request is invalid) is an SSE `error` event carrying the
format's own error body, which the OpenAI and Anthropic SDKs raise as their API error. The
frames are the writer's (server.writer.encode_frame): this module only decides when they go."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import orjson

from mlx_serve.engine.errors import ServeError
from mlx_serve.protocols.contract import ErrorFormat, Message, Send, SseComment, SseEvent
from mlx_serve.server.dispatch import send_error
from mlx_serve.server.registry import Registry, Slot, named
from mlx_serve.server.writer import SSE_HEADERS, encode_frame

LOADING = encode_frame(SseComment("loading the model"))


class Streams(msgspec.Struct):
    stream: Any = None


def streams(body: bytes) -> bool:
    try:
        return msgspec.json.decode(body, type=Streams).stream is True
    except msgspec.DecodeError:
        return False


def loading_for_stream(registry: Registry, body: bytes, sse: bool) -> Slot | None:
    """A streaming SSE request's model when it is not loaded yet (Ollama streams NDJSON, which
    has no comment lines to keep it alive: it waits as a plain request does)."""
    if not sse or not streams(body):
        return None
    slot = registry.resolve(named(body))
    return slot if slot is not None and slot.state != "loaded" else None


class EarlyStream:
    """The client's `send` once the head has gone: the handler's own head is dropped, and a
    refusal's JSON body becomes an SSE error event."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self._refusal = False

    async def head(self) -> None:
        await self._send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})

    async def heartbeat(self) -> None:
        await self._send({"type": "http.response.body", "body": LOADING, "more_body": True})

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._refusal = message["status"] != 200
            return
        if self._refusal and message["type"] == "http.response.body":
            error = SseEvent(orjson.loads(bytes(message.get("body", b"")) or b"{}"), "error")
            message = {"type": "http.response.body", "body": encode_frame(error), "more_body": False}
        await self._send(message)


async def stream_after_load(
    registry: Registry,
    slot: Slot,
    send: Send,
    errors: ErrorFormat,
    heartbeat_s: float,
    answer: Callable[[Send], Awaitable[None]],
) -> None:
    """Load the slot's model with the stream's head and heartbeats going out meanwhile, then
    `answer` on the same stream; the model is held from the load to the answer's end."""
    early = EarlyStream(send)
    async with registry.use(slot):
        await early.head()
        await early.heartbeat()  # a server may hold the head back until a body part comes
        try:
            loading = asyncio.ensure_future(registry.ensure(slot))
            try:
                while not loading.done():
                    await asyncio.wait({loading}, timeout=heartbeat_s)
                    if not loading.done():
                        await early.heartbeat()
            finally:
                loading.cancel()
            loading.result()
            await answer(early)
        except ServeError as exc:
            await send_error(early, errors, exc)
