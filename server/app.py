"""The ASGI application: a (method, path) table, body limits, CORS, and the handlers."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

import orjson

from engine.errors import EngineUnavailable, QueueFull, ServeError
from engine.thread import Engine, EngineState
from engine.tokenizer import ChatTokenizer
from engine.types import Request
from protocols import anthropic_messages, openai_chat, openai_completions, openai_responses
from protocols.contract import (
    ClientGone,
    Defaults,
    Job,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ProtocolContext,
    Receive,
    Scope,
    Send,
    WireFormat,
)
from server.config import Config
from server.observe import record_of
from server.writer import collect, send_json, stream_sse

log = logging.getLogger("mlx_serve.http")
Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
OPENAI_ERRORS = openai_chat.FORMAT


class App:
    """mlx-serve's ASGI callable. Serves at once; /health says 503 until the model is ready."""

    def __init__(self, config: Config, engine: Engine) -> None:
        self.config = config
        self.engine = engine
        self.created = int(time.time())
        self._ctx: ProtocolContext | None = None
        self.responses = openai_responses.OpenAIResponses(openai_responses.ResponsesStore())
        self.routes: dict[tuple[str, str], Handler] = {
            ("GET", "/health"): self.health,
            ("GET", "/v1/models"): self.models,
            ("GET", "/stats"): self.stats,
            ("POST", "/v1/chat/completions"): self.generation(openai_chat.FORMAT),
            ("POST", "/v1/completions"): self.generation(openai_completions.FORMAT),
            ("POST", "/v1/messages"): self.generation(anthropic_messages.FORMAT),
            ("POST", "/v1/messages/count_tokens"): self.count_tokens,
            ("POST", "/v1/responses"): self.generation(self.responses),
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            await self.dispatch(scope, receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.engine.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.engine.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        method, path = scope["method"], scope["path"].rstrip("/") or "/"
        send = self._with_cors(scope, send)
        if method == "OPTIONS" and self.config.allowed_origins:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        handler = self.routes.get((method, path)) or self._fallback(method, path)
        try:
            await handler(scope, receive, send)
        except ServeError as exc:
            await self.error(send, error_format(path), exc)

    def _fallback(self, method: str, path: str) -> Handler:
        if method == "GET" and path.startswith("/v1/models/"):
            return self.model_one
        if method in ("GET", "DELETE") and path.startswith("/v1/responses/"):
            return self.stored_response
        if any(p == path for _, p in self.routes):
            raise_it: ServeError = MethodNotAllowed(f"{method} is not allowed on {path}")
        else:
            raise_it = NotFound(f"no route for {method} {path}")

        async def refuse(scope: Scope, receive: Receive, send: Send) -> None:
            raise raise_it

        return refuse

    async def error(self, send: Send, fmt: WireFormat, exc: ServeError) -> None:
        extra = []
        if isinstance(exc, QueueFull):
            extra.append((b"retry-after", str(exc.retry_after_s).encode()))
        await send_json(send, exc.status, fmt.error_body(exc), extra)

    # -- plain routes -------------------------------------------------------------------

    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.engine.state
        if state is EngineState.READY:
            await send_json(send, 200, b'{"status":"ok"}')
            return
        body = {
            "status": "loading" if state is EngineState.LOADING else "unavailable",
            "error": self.engine.error,
        }
        await send_json(send, 503, orjson.dumps(body))

    def _model_card(self) -> dict[str, object]:
        model_id = self.engine.loaded.model_id if self.engine.loaded else (self.config.model or "")
        return {"id": model_id, "object": "model", "created": self.created, "owned_by": "mlx-serve"}

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, orjson.dumps({"object": "list", "data": [self._model_card()]}))

    async def model_one(self, scope: Scope, receive: Receive, send: Send) -> None:
        wanted = scope["path"].removeprefix("/v1/models/")
        card = self._model_card()
        if wanted != card["id"]:
            raise NotFound(f"model '{wanted}' is not served here (serving '{card['id']}')")
        await send_json(send, 200, orjson.dumps(card))

    async def stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = {"state": self.engine.state.value, **await self.engine.stats()}
        await send_json(send, 200, orjson.dumps(body))

    async def count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(receive, self.config.max_body_bytes)
            status, out = anthropic_messages.count_tokens(body, self.context())
        except ServeError as exc:
            await self.error(send, anthropic_messages.FORMAT, exc)
            return
        await send_json(send, status, out)

    async def stored_response(self, scope: Scope, receive: Receive, send: Send) -> None:
        response_id = scope["path"].rstrip("/").removeprefix("/v1/responses/")
        if scope["method"] == "DELETE":
            status, body = self.responses.delete(response_id)
        else:
            status, body = self.responses.retrieve(response_id, scope.get("query_string", b""))
        await send_json(send, status, body)

    # -- generation ---------------------------------------------------------------------

    def generation(self, fmt: WireFormat) -> Handler:
        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            try:
                await self._generate(fmt, scope, receive, send)
            except ServeError as exc:
                await self.error(send, fmt, exc)

        return handle

    async def _generate(self, fmt: WireFormat, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive, self.config.max_body_bytes)
        ctx = self.context()
        job = fmt.parse(body, ctx)
        stream = record_of(scope).track(self.engine.submit(choices(job)))
        notes = [(b"warning", w.encode()) for w in stream.warnings]
        if job.stream:
            renderer = fmt.renderer(job, ctx)
            await stream_sse(receive, send, stream, renderer, self.config.heartbeat_s, notes)
            return
        results = await collect(receive, stream)
        if results is not None:
            await send_json(send, 200, fmt.to_json(job, results, ctx), notes)

    def context(self) -> ProtocolContext:
        if self._ctx is None:
            if not self.engine.ready:
                raise EngineUnavailable(f"model is {self.engine.state.value}; try again shortly")
            c = self.config
            defaults = Defaults(c.temp, c.top_p, c.top_k, c.min_p, c.max_tokens, c.chat_template_args)
            tokenizer = ChatTokenizer(self.engine.loaded.tokenizer)
            self._ctx = ProtocolContext(self.engine.loaded.model_id, tokenizer, defaults, self.created)
        return replace(self._ctx, created=int(time.time()))

    # -- CORS ----------------------------------------------------------------------------

    def _with_cors(self, scope: Scope, send: Send) -> Send:
        allowed = self.config.allowed_origins
        origin = dict(scope.get("headers", [])).get(b"origin", b"").decode("latin-1")
        if not allowed or not origin or not ("*" in allowed or origin in allowed):
            return send
        cors = [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
            (b"access-control-allow-headers", b"authorization, content-type, x-api-key"),
            (b"vary", b"origin"),
        ]

        async def cors_send(message: dict) -> None:  # type: ignore[type-arg]
            if message["type"] == "http.response.start":
                message = {**message, "headers": list(message.get("headers", [])) + cors}
            await send(message)

        return cors_send


def error_format(path: str) -> WireFormat:
    """Errors outside a handler still answer in the format the client speaks."""
    return anthropic_messages.FORMAT if path.startswith("/v1/messages") else OPENAI_ERRORS


def choices(job: Job) -> list[Request]:
    """One engine request per choice; with n > 1 they share one prefill of the prompt."""
    first = job.request
    if job.n == 1:
        return [first]
    leader = replace(first, id=f"{first.id}-0", share_prompt=True)
    out = [leader]
    for i in range(1, job.n):
        seed = first.sampling.seed
        sampling = replace(first.sampling, seed=None if seed is None else seed + i)
        out.append(replace(first, id=f"{first.id}-{i}", sampling=sampling, after=leader.id))
    return out


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body, or 413 as soon as it passes `limit` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("client went away while sending its request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is over the {limit}-byte limit")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
