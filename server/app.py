"""The ASGI application: the route table's dispatch and the handlers behind it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import TypeVar

import msgspec
import orjson

from mlx_serve.engine.errors import EngineUnavailable, InvalidRequest
from mlx_serve.engine.host.client import EngineClient
from mlx_serve.engine.model.loader import served_id
from mlx_serve.engine.types import Request
from mlx_serve.engine.validation import validate_call
from mlx_serve.protocols import (
    anthropic_messages,
    ollama,
    ollama_embed,
    ollama_facts,
    openai_chat,
    openai_completions,
    openai_embeddings,
    openai_responses,
    token_tools,
)
from mlx_serve.protocols.anthropic_diagnostics import CacheDiagnoser
from mlx_serve.protocols.anthropic_threads import ThreadStore
from mlx_serve.protocols.contract import (
    Defaults,
    ErrorFormat,
    EventStream,
    Handler,
    Job,
    ModelNotFound,
    ProtocolContext,
    Receive,
    Route,
    Scope,
    Send,
    WireFormat,
)
from mlx_serve.server.body import read_body
from mlx_serve.server.config import Config
from mlx_serve.server.dispatch import OPENAI_ERRORS, dispatch
from mlx_serve.server.load_wait import loading_for_stream, stream_after_load
from mlx_serve.server.metrics import Metrics
from mlx_serve.server.model_context import engine_of, protocol_context
from mlx_serve.server.model_routes import ModelRoutes
from mlx_serve.server.names import ServedNames
from mlx_serve.server.observe import record_of
from mlx_serve.server.page import Page
from mlx_serve.server.recent import RecentRequests
from mlx_serve.server.registry import NamedModel, Registry, Slot
from mlx_serve.server.request_parts import betas, choices, nesting_bounded, principal
from mlx_serve.server.responses_socket import ResponsesSocket
from mlx_serve.server.routes import RouteTable
from mlx_serve.server.writer import collect, header_value, send_json, stream_sse, warning_headers

log = logging.getLogger("mlx_serve.http")
T = TypeVar("T")
ANTHROPIC_ERRORS: ErrorFormat = anthropic_messages.FORMAT
# How each format spells the engine fields it names differently (for validation's 400s).
CHAT_NAMES = {"prompt_tokens": "messages", "logprobs": "top_logprobs"}
COMPLETION_NAMES = {"prompt_tokens": "prompt"}
MESSAGES_NAMES = {"prompt_tokens": "messages", "stop": "stop_sequences"}
SOCKET_PATH = "/v1/responses"  # Responses over WebSocket (server.responses_socket)
RESPONSES_NAMES = {"prompt_tokens": "input", "max_tokens": "max_output_tokens", "logprobs": "top_logprobs"}


class App:
    """mlx-serve's ASGI callable. Serves at once; /health says 503 until the model is ready."""

    def __init__(
        self, config: Config, engine: EngineClient | Registry, metrics: Metrics | None = None
    ) -> None:
        self.config = config
        self.registry = engine if isinstance(engine, Registry) else Registry.one(engine)
        self.metrics = metrics or Metrics()
        self.created = int(time.time())
        self.listing = ModelRoutes(self)
        self.responses = openai_responses.OpenAIResponses(openai_responses.ResponsesStore())
        self.messages = anthropic_messages.AnthropicMessages(ThreadStore(), CacheDiagnoser())
        self.recent = RecentRequests()
        self.page = Page() if config.ui else None
        self.table = RouteTable(self._routes(), OPENAI_ERRORS)

    def _routes(self) -> list[Route]:
        """Every endpoint, once: add a wire format here with its protocol module."""
        gen, oa, an = self.generation, OPENAI_ERRORS, ANTHROPIC_ERRORS
        health_open, metrics_open = not self.config.protect_health, not self.config.protect_metrics
        return [
            Route("GET", "/health", self.listing.health, oa, open=health_open, probe=True),
            Route("GET", "/metrics", self.metrics_text, oa, open=metrics_open, probe=True),
            Route("GET", "/stats", self.stats, oa, open=metrics_open),
            Route("GET", "/stats/recent", self.recent.handle, oa, probe=True),
            *(self.page.routes(oa) if self.page else []),
            Route("GET", "/v1/models", self.listing.models, oa),
            Route("GET", "/v1/models/{model_id}", self.listing.model_one, oa),
            *self.listing.admin_routes(oa),
            Route("POST", "/v1/chat/completions", gen(openai_chat.FORMAT, CHAT_NAMES), oa),
            Route("POST", "/chat/completions", gen(openai_chat.FORMAT, CHAT_NAMES), oa),  # as mlx_lm.server
            Route("POST", "/v1/completions", gen(openai_completions.FORMAT, COMPLETION_NAMES), oa),
            Route("POST", "/completions", gen(openai_completions.FORMAT, COMPLETION_NAMES), oa),
            Route("POST", "/v1/embeddings", self.embeddings, oa),
            Route("POST", "/embeddings", self.embeddings, oa),
            Route("POST", "/v1/messages", gen(self.messages, MESSAGES_NAMES), an),
            Route("POST", "/v1/messages/count_tokens", self.count_tokens, an),
            Route("POST", "/v1/responses", gen(self.responses, RESPONSES_NAMES), oa),
            Route("POST", "/v1/responses/compact", self.compact, oa),
            Route("GET", "/v1/responses/{response_id}", self.stored_response, oa),
            Route("DELETE", "/v1/responses/{response_id}", self.stored_response, oa),
            *self._ollama_routes(),
            *self._token_routes(),
        ]

    def _ollama_routes(self) -> list[Route]:
        ol, gen, answer = ollama.CHAT, self.generation, self.answer
        return [
            Route("POST", "/api/chat", gen(ollama.CHAT, ollama.CHAT_NAMES), ol),
            Route("POST", "/api/generate", gen(ollama.GENERATE, ollama.GENERATE_NAMES), ol),
            Route("GET", "/api/tags", self._facts_route(ollama_facts.tags, self.listing.ollama_tags), ol),
            Route("POST", "/api/show", answer(ollama_facts.show, facts=True), ol),
            Route("GET", "/api/ps", self._facts_route(ollama_facts.ps, self.listing.ollama_ps), ol),
            Route(
                "GET",
                "/api/version",
                self._facts_route(ollama_facts.version, self.listing.ollama_version),
                ol,
            ),
            Route("POST", "/api/embed", self.embedding(ollama_embed.EMBED), ol),
            Route("POST", "/api/embeddings", self.embedding(ollama_embed.EMBEDDINGS), ol),
        ]

    def _facts_route(
        self, fn: Callable[[bytes, ProtocolContext], tuple[int, bytes]], many: Handler
    ) -> Handler:
        """A fact about the model on a one-model server; the registry's answer with many."""
        return self.answer(fn, facts=True) if self.registry.single else many

    def _token_routes(self) -> list[Route]:
        oa, answer = OPENAI_ERRORS, self.answer
        responses_count = token_tools.input_tokens(self.responses, "response.input_tokens")
        return [
            Route("POST", "/tokenize", answer(token_tools.tokenize), oa),
            Route("POST", "/detokenize", answer(token_tools.detokenize), oa),
            Route("POST", "/apply-template", answer(token_tools.apply_template), oa),
            Route("POST", "/v1/chat/completions/input_tokens", answer(token_tools.chat_input_tokens), oa),
            Route("POST", "/v1/responses/input_tokens", answer(responses_count), oa),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.lifespan(receive, send)
        elif scope["type"] == "http":
            await self.dispatch(scope, receive, send)
        elif scope["type"] == "websocket" and scope["path"].rstrip("/") == SOCKET_PATH:
            await ResponsesSocket(self, self.responses, SOCKET_PATH)(scope, receive, send)
        elif scope["type"] == "websocket":
            await self.refuse_websocket(scope, receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.registry.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.registry.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def refuse_websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket anywhere but /v1/responses: the upgrade is refused (Hypercorn answers
        403), never a 500."""
        await receive()  # websocket.connect
        log.info("refused a WebSocket upgrade on %s: only %s takes one", scope.get("path"), SOCKET_PATH)
        await send({"type": "websocket.close", "code": 1008})

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        await dispatch(self.table, scope, receive, send)

    # -- plain routes -------------------------------------------------------------------

    async def metrics_text(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self.metrics.render(self.registry.stats_source())
        await send_json(send, 200, body, content_type=self.metrics.content_type)

    @property
    def engine(self) -> EngineClient:
        """The default model's engine (the one model's, on a one-model server)."""
        engine = self.registry.default.engine
        if engine is None:
            raise EngineUnavailable(f"model '{self.registry.default.name}' is not loaded")
        return engine

    def names(self, slot: Slot | None = None) -> ServedNames:
        if not self.registry.single:
            return (slot or self.registry.default).names()
        model = self.engine.model
        model_id = model.model_id if model else served_id(self.config.model)
        return ServedNames(model_id, self.config.model, tuple(self.config.served_model_name))

    async def stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.registry.single:
            body = {"state": self.engine.state.value, **await self.engine.stats()}
        else:
            body = await self.listing.stats()
        await send_json(send, 200, orjson.dumps(body))

    async def count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self.read_body(scope, receive)
        async with self.model_for(body) as slot:
            status, out = await asyncio.to_thread(
                nesting_bounded, self.messages.count_tokens, body, self.context(scope, slot)
            )
            if status == 200:  # a model /v1/messages refuses is refused here too
                self._check_model(msgspec.json.decode(body, type=NamedModel).model or "", slot)
        await send_json(send, status, out)

    async def compact(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v1/responses/compact: the conversation summarised by the model, as one
        compaction item after the user's messages."""
        body = await self.read_body(scope, receive)
        async with self.model_for(body) as slot:
            ctx = self.context(scope, slot)
            job = await asyncio.to_thread(nesting_bounded, self.responses.compact_job, body, ctx)
            self._check_model(job.model, slot)
            validate_call([job.request], slot.limits, RESPONSES_NAMES)
            stream = record_of(scope).track(engine_of(slot).submit([job.request]))
            results = await collect(receive, stream)
            if results is not None:
                notes = warning_headers(stream.warnings)
                await send_json(send, 200, self.responses.compacted(job, results[0], ctx), notes)

    async def stored_response(self, scope: Scope, receive: Receive, send: Send) -> None:
        response_id = scope["path_params"]["response_id"]
        if scope["method"] == "DELETE":
            status, body = self.responses.delete(response_id, principal(scope))
        else:
            query = scope.get("query_string", b"")
            status, body = self.responses.retrieve(response_id, query, principal(scope))
        await send_json(send, status, body)

    def answer(
        self, fn: Callable[[bytes, ProtocolContext], tuple[int, bytes]], facts: bool = False
    ) -> Handler:
        """A route its protocol answers whole from the body (token counts, model facts), off the
        event loop as tokenizing a big body must be: `fn` gives the status and the body. Only
        `facts` routes (what the model is) answer on an embedding model."""

        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            body = await self.read_body(scope, receive)
            async with self.model_for(body) as slot:
                names = self.names(slot)
                base = self._facts_context(scope, slot) if facts else self.context(scope, slot)
                ctx = replace(base, listed=tuple(names.listed), accepts=names.accepts)
                status, out = await asyncio.to_thread(nesting_bounded, fn, body, ctx)
            await send_json(send, status, out)

        return handle

    async def embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v1/embeddings: a vector per input, from an embedding model's engine."""
        body = await self.read_body(scope, receive)
        job = await asyncio.to_thread(openai_embeddings.parse, body)
        async with self.model_for(body) as slot:
            self._check_model(job.model, slot)
            result = await engine_of(slot).embed(job.inputs, job.dimensions)
        await send_json(send, 200, openai_embeddings.to_json(job, result, self.names(slot).model_id))

    def _facts_context(self, scope: Scope, slot: Slot) -> ProtocolContext:
        """The context of routes that tell about the model: an embedding model's too."""
        model = engine_of(slot).model
        if model is None or model.dimensions is None:
            return self.context(scope, slot)
        return ProtocolContext(
            model.model_id if self.registry.single else slot.name, model.tokenizer, Defaults(), self.created, model.context_length,
            dimensions=model.dimensions, facts=model.facts,
        )  # fmt: skip

    def embedding(self, fmt: ollama_embed.OllamaEmbed) -> Handler:
        """Ollama's embeddings routes: its parse, the engine's vectors, its answer."""

        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            body = await self.read_body(scope, receive)
            job = await asyncio.to_thread(fmt.parse, body)
            async with self.model_for(body) as slot:
                self._check_model(job.model, slot)
                result = await engine_of(slot).embed(job.inputs, job.dimensions)
            await send_json(send, 200, fmt.to_json(job, result), warning_headers(job.warnings))

        return handle

    # -- generation ---------------------------------------------------------------------

    def generation(self, fmt: WireFormat, names: Mapping[str, str]) -> Handler:
        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            await self._generate(fmt, names, scope, receive, send)

        return handle

    async def prepare(
        self, fmt: WireFormat, body: bytes, ctx: ProtocolContext, slot: Slot | None = None
    ) -> tuple[Job, list[Request]]:
        """A Responses turn on a WebSocket: its job and engine requests, checked as over HTTP."""
        slot = slot or self.registry.default
        job, requests = await asyncio.to_thread(self._parse, fmt, RESPONSES_NAMES, body, ctx, slot)
        self._check_model(job.model, slot)
        await engine_of(slot).check_grammars(requests)
        return job, requests

    def submit(self, requests: list[Request], slot: Slot | None = None) -> EventStream:
        return engine_of(slot or self.registry.default).submit(requests)

    async def read_body(self, scope: Scope, receive: Receive) -> bytes:
        return await read_body(scope, receive, self.config.max_body_bytes, self.config.body_timeout_s)

    async def _generate(
        self, fmt: WireFormat, names: Mapping[str, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        body = await self.read_body(scope, receive)
        if self.registry.single:  # the one model: no lookup, nothing to hold
            await self._generate_on(self.registry.default, fmt, names, body, scope, receive, send)
            return
        slot = loading_for_stream(self.registry, body, sse=fmt not in (ollama.CHAT, ollama.GENERATE))
        if slot is not None:  # its head and heartbeats go out while the model loads
            errors = self.table.match_scope(scope).errors or OPENAI_ERRORS
            answer = partial(self._generate_on, slot, fmt, names, body, scope, receive)
            await stream_after_load(self.registry, slot, send, errors, self.config.heartbeat_s, answer)
            return
        async with self.model_for(body) as slot:
            await self._generate_on(slot, fmt, names, body, scope, receive, send)

    async def _generate_on(
        self, slot: Slot, fmt: WireFormat, names: Mapping[str, str], body: bytes, scope: Scope,
        receive: Receive, send: Send,
    ) -> None:  # fmt: skip
        ctx = self.context(scope, slot)
        # Decoding, templating, tokenizing and validating are CPU work: off the event loop.
        job, requests = await asyncio.to_thread(self._parse, fmt, names, body, ctx, slot)
        record_of(scope).fields += job.log_fields
        self._check_model(job.model, slot)
        engine = engine_of(slot)
        await engine.check_grammars(requests)
        if job.answer is not None:
            await send_json(send, 200, job.answer)
            return
        stream = record_of(scope).track(engine.submit(requests))
        for note in job.warnings:
            log.warning("%s %s: %s", scope["method"], scope["path"], header_value(note).decode())
        notes = warning_headers((*job.warnings, *stream.warnings))
        if job.stream:
            renderer = fmt.renderer(job, ctx)
            await stream_sse(receive, send, stream, renderer, self.config.heartbeat_s, notes, job.framing)
            return
        results = await collect(receive, stream)
        if results is not None:
            await send_json(send, 200, fmt.to_json(job, results, ctx), notes)

    def _parse(
        self, fmt: WireFormat, names: Mapping[str, str], body: bytes, ctx: ProtocolContext, slot: Slot
    ) -> tuple[Job, list[Request]]:
        """The format's job, its engine requests (one per choice), every field checked."""
        job = nesting_bounded(fmt.parse, body, ctx)
        if job.answer is not None:  # answered without the engine
            return job, []
        requests = choices(job)
        validate_call(requests, slot.limits, names)
        return job, requests

    def model_for(self, body: bytes) -> contextlib.AbstractAsyncContextManager[Slot]:
        """The model a body names, loaded and held while the request runs (Registry.picked)."""
        return self.registry.picked(body)

    def _check_model(self, name: str, slot: Slot) -> None:
        if self.registry.single:
            names = self.names()
            if not names.accepts(name):
                raise ModelNotFound(names.refusal(name), param="model")
        elif self.registry.resolve(name) is not slot:
            raise ModelNotFound(self.registry.refusal(name), param="model")

    def context(self, scope: Scope | None = None, slot: Slot | None = None) -> ProtocolContext:
        slot = slot or self.registry.default
        engine = slot.engine
        model = engine.model if engine is not None else None
        if model is not None and model.dimensions is not None:
            raise InvalidRequest(
                f"model '{model.model_id}' is an embedding model: it serves POST /v1/embeddings only",
                param="model",
            )
        if slot.ctx is None:
            protocol_context(self.config, slot, self.created, use_model_id=self.registry.single)
        scope = scope or {}
        assert slot.ctx is not None
        return replace(slot.ctx, created=int(time.time()), principal=principal(scope), betas=betas(scope))
