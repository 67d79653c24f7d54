"""The ASGI application: the route table's dispatch and the handlers behind it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TypeVar

import msgspec
import orjson

from engine.errors import EngineUnavailable, InvalidRequest, QueueFull, ServeError
from engine.host.client import EngineClient, EngineState
from engine.model.loader import served_id
from engine.types import Request, SamplingParams
from engine.validation import Limits, validate_call
from protocols import (
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
from protocols.anthropic_diagnostics import CacheDiagnoser
from protocols.anthropic_threads import ThreadStore
from protocols.contract import (
    Defaults,
    ErrorFormat,
    EventStream,
    Handler,
    Job,
    Message,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    ProtocolContext,
    Receive,
    Route,
    Scope,
    Send,
    WireFormat,
)
from server.auth import PRINCIPAL_KEY
from server.body import AmbiguousFraming, check_framing, read_body
from server.config import Config
from server.connections import OVER_CAPACITY, ConnectionLimit
from server.metrics import Metrics
from server.names import ServedNames
from server.observe import record_of
from server.page import Page
from server.recent import RecentRequests
from server.responses_socket import ResponsesSocket
from server.routes import Fit, RouteTable
from server.writer import collect, header_value, send_json, stream_sse, warning_headers

log = logging.getLogger("mlx_serve.http")
T = TypeVar("T")
OPENAI_ERRORS: ErrorFormat = openai_chat.FORMAT
ANTHROPIC_ERRORS: ErrorFormat = anthropic_messages.FORMAT
RETRY_AFTER_LOADING_S = 5
# How each format spells the engine fields it names differently (for validation's 400s).
CHAT_NAMES = {"prompt_tokens": "messages", "logprobs": "top_logprobs"}
COMPLETION_NAMES = {"prompt_tokens": "prompt"}
MESSAGES_NAMES = {"prompt_tokens": "messages", "stop": "stop_sequences"}
SOCKET_PATH = "/v1/responses"  # Responses over WebSocket (server.responses_socket)
RESPONSES_NAMES = {"prompt_tokens": "input", "max_tokens": "max_output_tokens", "logprobs": "top_logprobs"}


class App:
    """mlx-serve's ASGI callable. Serves at once; /health says 503 until the model is ready."""

    def __init__(self, config: Config, engine: EngineClient, metrics: Metrics | None = None) -> None:
        self.config = config
        self.engine = engine
        self.metrics = metrics or Metrics()
        self.created = int(time.time())
        self._ctx: ProtocolContext | None = None
        self._limits = Limits(0)
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
            Route("GET", "/health", self.health, oa, open=health_open, probe=True),
            Route("GET", "/metrics", self.metrics_text, oa, open=metrics_open, probe=True),
            Route("GET", "/stats", self.stats, oa, open=metrics_open),
            Route("GET", "/stats/recent", self.recent.handle, oa, probe=True),
            *(self.page.routes(oa) if self.page else []),
            Route("GET", "/v1/models", self.models, oa),
            Route("GET", "/v1/models/{model_id}", self.model_one, oa),
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
            Route("GET", "/api/tags", answer(ollama_facts.tags, facts=True), ol),
            Route("POST", "/api/show", answer(ollama_facts.show, facts=True), ol),
            Route("GET", "/api/ps", answer(ollama_facts.ps, facts=True), ol),
            Route("GET", "/api/version", answer(ollama_facts.version, facts=True), ol),
            Route("POST", "/api/embed", self.embedding(ollama_embed.EMBED), ol),
            Route("POST", "/api/embeddings", self.embedding(ollama_embed.EMBEDDINGS), ol),
        ]

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
                self.engine.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.engine.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def refuse_websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket anywhere but /v1/responses: the upgrade is refused (Hypercorn answers
        403), never a 500."""
        await receive()  # websocket.connect
        log.info("refused a WebSocket upgrade on %s: only %s takes one", scope.get("path"), SOCKET_PATH)
        await send({"type": "websocket.close", "code": 1008})

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = self.table.match_scope(scope)
        errors = match.errors or OPENAI_ERRORS
        if scope["method"] == "HEAD":
            send = _without_body(send)
        try:
            check_framing(scope)
            if scope.get(OVER_CAPACITY) and not (match.route is not None and match.route.probe):
                raise ConnectionLimit("the server is at its connection limit; retry shortly")
            if match.fit is Fit.FULL:
                assert match.route is not None
                scope["path_params"] = match.params
                await match.route.handler(scope, receive, send)
            elif match.fit is Fit.PARTIAL:
                allow = ", ".join(match.allowed)
                raise MethodNotAllowed(
                    f"{scope['method']} is not allowed on {scope['path']} (allowed: {allow})"
                )
            else:
                raise NotFound(f"no route for {scope['method']} {scope['path']}")
        except ServeError as exc:
            record_of(scope).refused(exc)
            extra = [(b"allow", ", ".join(match.allowed).encode())] if match.fit is Fit.PARTIAL else []
            await self.error(send, errors, exc, extra)

    async def error(
        self, send: Send, fmt: ErrorFormat, exc: ServeError, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        headers = list(extra or [])
        if isinstance(exc, QueueFull | ConnectionLimit):
            headers.append((b"retry-after", str(exc.retry_after_s).encode()))
        elif isinstance(exc, EngineUnavailable):
            headers.append((b"retry-after", str(RETRY_AFTER_LOADING_S).encode()))
        elif isinstance(exc, AmbiguousFraming):
            headers.append((b"connection", b"close"))  # where this body ends is unknowable
        await send_json(send, exc.status, fmt.error_body(exc), headers)

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
        retry = [(b"retry-after", str(RETRY_AFTER_LOADING_S).encode())]
        await send_json(send, 503, orjson.dumps(body), retry)

    async def metrics_text(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self.metrics.render(self.engine)
        await send_json(send, 200, body, content_type=self.metrics.content_type)

    def names(self) -> ServedNames:
        model = self.engine.model
        model_id = model.model_id if model else served_id(self.config.model)
        return ServedNames(model_id, self.config.model, tuple(self.config.served_model_name))

    def _model_cards(self, scope: Scope) -> list[dict[str, object]]:
        """One entry per listed name, with the context a request may use (OpenAI's shape, plus
        the fields vLLM, llama.cpp and LM Studio clients read; Anthropic's for Anthropic SDKs)."""
        model = self.engine.model
        context = model.context_length if model else None
        if _speaks_anthropic(scope):
            # Claude Code sizes its window (and when it compacts) from max_input_tokens.
            limits = {"max_input_tokens": context, "max_tokens": context, "lifecycle": "active"}
            return [
                {"type": "model", "id": n, "display_name": n, "created_at": _iso(self.created), **limits}
                for n in self.names().listed
            ]
        extra = {"context_length": context, "max_model_len": context, "max_context_length": context}
        return [
            {"id": n, "object": "model", "created": self.created, "owned_by": "mlx-serve", **extra}
            for n in self.names().listed
        ]

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        cards = self._model_cards(scope)
        body: dict[str, object] = {"object": "list", "data": cards}
        if _speaks_anthropic(scope):
            body = {"data": cards, "has_more": False, "first_id": cards[0]["id"], "last_id": cards[-1]["id"]}
        await send_json(send, 200, orjson.dumps(body))

    async def model_one(self, scope: Scope, receive: Receive, send: Send) -> None:
        wanted = scope["path_params"]["model_id"]
        names = self.names()
        if not names.accepts(wanted):
            raise ModelNotFound(names.refusal(wanted), param="model")
        card = {**self._model_cards(scope)[0], "id": wanted}
        if _speaks_anthropic(scope):
            card["display_name"] = wanted
        await send_json(send, 200, orjson.dumps(card))

    async def stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = {"state": self.engine.state.value, **await self.engine.stats()}
        await send_json(send, 200, orjson.dumps(body))

    async def count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await self._read_body(scope, receive)
        status, out = await asyncio.to_thread(
            _nesting_bounded, self.messages.count_tokens, body, self.context(scope)
        )
        if status == 200:  # a model /v1/messages refuses is refused here too
            self._check_model(msgspec.json.decode(body, type=NamedModel).model or "")
        await send_json(send, status, out)

    async def compact(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v1/responses/compact: the conversation summarised by the model, as one
        compaction item after the user's messages."""
        body = await self._read_body(scope, receive)
        ctx = self.context(scope)
        job = await asyncio.to_thread(_nesting_bounded, self.responses.compact_job, body, ctx)
        self._check_model(job.model)
        validate_call([job.request], self._limits, RESPONSES_NAMES)
        stream = record_of(scope).track(self.engine.submit([job.request]))
        results = await collect(receive, stream)
        if results is not None:
            notes = warning_headers(stream.warnings)
            await send_json(send, 200, self.responses.compacted(job, results[0], ctx), notes)

    async def stored_response(self, scope: Scope, receive: Receive, send: Send) -> None:
        response_id = scope["path_params"]["response_id"]
        if scope["method"] == "DELETE":
            status, body = self.responses.delete(response_id, _principal(scope))
        else:
            query = scope.get("query_string", b"")
            status, body = self.responses.retrieve(response_id, query, _principal(scope))
        await send_json(send, status, body)

    def answer(
        self, fn: Callable[[bytes, ProtocolContext], tuple[int, bytes]], facts: bool = False
    ) -> Handler:
        """A route its protocol answers whole from the body (token counts, model facts), off the
        event loop as tokenizing a big body must be: `fn` gives the status and the body. Only
        `facts` routes (what the model is) answer on an embedding model."""

        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            body = await self._read_body(scope, receive)
            names = self.names()
            base = self._facts_context(scope) if facts else self.context(scope)
            ctx = replace(base, listed=tuple(names.listed), accepts=names.accepts)
            status, out = await asyncio.to_thread(_nesting_bounded, fn, body, ctx)
            await send_json(send, status, out)

        return handle

    async def embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v1/embeddings: a vector per input, from an embedding model's engine."""
        body = await self._read_body(scope, receive)
        job = await asyncio.to_thread(openai_embeddings.parse, body)
        self._check_model(job.model)
        result = await self.engine.embed(job.inputs, job.dimensions)
        await send_json(send, 200, openai_embeddings.to_json(job, result, self.names().model_id))

    def _facts_context(self, scope: Scope) -> ProtocolContext:
        """The context of routes that tell about the model: an embedding model's too."""
        model = self.engine.model
        if model is None or model.dimensions is None:
            return self.context(scope)
        return ProtocolContext(
            model.model_id, model.tokenizer, Defaults(), self.created, model.context_length,
            dimensions=model.dimensions,
        )  # fmt: skip

    def embedding(self, fmt: ollama_embed.OllamaEmbed) -> Handler:
        """Ollama's embeddings routes: its parse, the engine's vectors, its answer."""

        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            body = await self._read_body(scope, receive)
            job = await asyncio.to_thread(fmt.parse, body)
            self._check_model(job.model)
            result = await self.engine.embed(job.inputs, job.dimensions)
            await send_json(send, 200, fmt.to_json(job, result), warning_headers(job.warnings))

        return handle

    # -- generation ---------------------------------------------------------------------

    def generation(self, fmt: WireFormat, names: Mapping[str, str]) -> Handler:
        async def handle(scope: Scope, receive: Receive, send: Send) -> None:
            await self._generate(fmt, names, scope, receive, send)

        return handle

    async def prepare(self, fmt: WireFormat, body: bytes, ctx: ProtocolContext) -> tuple[Job, list[Request]]:
        """A Responses turn on a WebSocket: its job and engine requests, checked as over HTTP."""
        job, requests = await asyncio.to_thread(self._parse, fmt, RESPONSES_NAMES, body, ctx)
        self._check_model(job.model)
        await self.engine.check_grammars(requests)
        return job, requests

    def submit(self, requests: list[Request]) -> EventStream:
        return self.engine.submit(requests)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        return await read_body(scope, receive, self.config.max_body_bytes, self.config.body_timeout_s)

    async def _generate(
        self, fmt: WireFormat, names: Mapping[str, str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        body = await self._read_body(scope, receive)
        ctx = self.context(scope)
        # Decoding, templating, tokenizing and validating are CPU work: off the event loop.
        job, requests = await asyncio.to_thread(self._parse, fmt, names, body, ctx)
        record_of(scope).fields += job.log_fields
        self._check_model(job.model)
        await self.engine.check_grammars(requests)
        if job.answer is not None:
            await send_json(send, 200, job.answer)
            return
        stream = record_of(scope).track(self.engine.submit(requests))
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
        self, fmt: WireFormat, names: Mapping[str, str], body: bytes, ctx: ProtocolContext
    ) -> tuple[Job, list[Request]]:
        """The format's job, its engine requests (one per choice), every field checked."""
        job = _nesting_bounded(fmt.parse, body, ctx)
        if job.answer is not None:  # answered without the engine
            return job, []
        requests = choices(job)
        validate_call(requests, self._limits, names)
        return job, requests

    def _check_model(self, name: str) -> None:
        names = self.names()
        if not names.accepts(name):
            raise ModelNotFound(names.refusal(name), param="model")

    def context(self, scope: Scope | None = None) -> ProtocolContext:
        model = self.engine.model
        if model is not None and model.dimensions is not None:
            raise InvalidRequest(
                f"model '{model.model_id}' is an embedding model: it serves POST /v1/embeddings only",
                param="model",
            )
        if self._ctx is None:
            if not self.engine.ready or model is None:
                raise EngineUnavailable(f"model is {self.engine.state.value}; try again shortly")
            c = self.config
            server_sampling = SamplingParams(temperature=c.temp, top_p=c.top_p, top_k=c.top_k, min_p=c.min_p)
            defaults = Defaults(
                server_sampling,
                c.max_tokens,
                c.chat_template_args,
                c.reasoning_budget,
                c.reasoning_budget_message,
            )
            self._ctx = ProtocolContext(
                model.model_id, model.tokenizer, defaults, self.created, model.context_length,
                keep_billing_header=c.keep_billing_header,
            )  # fmt: skip
            self._limits = Limits(model.tokenizer.vocab_size, model.context_length)
        scope = scope or {}
        return replace(self._ctx, created=int(time.time()), principal=_principal(scope), betas=_betas(scope))


def _principal(scope: Scope) -> str:
    return str(scope.get(PRINCIPAL_KEY, ""))


def _betas(scope: Scope) -> frozenset[str]:
    values = [v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"anthropic-beta"]
    return frozenset(b.strip() for v in values for b in v.split(",") if b.strip())


class NamedModel(msgspec.Struct):
    """The `model` a request body names, read apart from the rest."""

    model: str | None = None


def _speaks_anthropic(scope: Scope) -> bool:
    return any(name == b"anthropic-version" for name, _ in scope.get("headers", []))


def _iso(unix: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))


def _without_body(send: Send) -> Send:
    """HEAD: the GET answer's status and headers, no body."""

    async def head_send(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return head_send


def choices(job: Job) -> list[Request]:
    """One engine request per choice, prompt by prompt (`n` each); the `n` choices of a prompt
    share one prefill of it. Choice i of prompt p is index p * n + i, as OpenAI numbers them."""
    first = job.request
    prompts = (first.prompt_tokens, *job.prompts)
    if len(prompts) == 1 and job.n == 1:
        return [first]
    out: list[Request] = []
    for p, tokens in enumerate(prompts):
        leader = replace(first, id=f"{first.id}-{p * job.n}", prompt_tokens=tokens, share_prompt=job.n > 1)
        out.append(leader)
        for i in range(1, job.n):
            seed = first.sampling.seed
            sampling = replace(first.sampling, seed=None if seed is None else seed + i)
            out.append(
                replace(
                    leader,
                    id=f"{first.id}-{p * job.n + i}",
                    sampling=sampling,
                    share_prompt=False,
                    after=leader.id,
                )
            )
    return out


def _nesting_bounded(parse: Callable[[bytes, ProtocolContext], T], body: bytes, ctx: ProtocolContext) -> T:
    """A RecursionError while reading a body comes from the client's nesting (msgspec's
    decoder, or a schema or template walking it): a 400 that says so."""
    try:
        return parse(body, ctx)
    except RecursionError:
        raise InvalidRequest(
            "the request nests arrays and objects too deeply (hundreds of levels) to be read"
        ) from None
