"""The routes that tell about the models and manage them: /health, /v1/models (OpenAI's and
Anthropic's lists), Ollama's /api/tags and /api/ps on a many-model server, and the admin API
behind the API key (llama.cpp router's shapes): GET /models, POST /models/load,
POST /models/unload and GET /models/sse (progress events: loading, ready, unloaded, failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Protocol

import msgspec
import orjson

from mlx_serve.engine.errors import InvalidRequest, ServeError
from mlx_serve.engine.host.client import EngineClient, EngineState
from mlx_serve.engine.model.facts import ModelFacts
from mlx_serve.protocols.contract import ErrorFormat, ModelNotFound, Receive, Route, Scope, Send
from mlx_serve.protocols.ollama_facts import OLLAMA_VERSION, entry, loaded
from mlx_serve.server.config import Config
from mlx_serve.server.dispatch import RETRY_AFTER_LOADING_S
from mlx_serve.server.names import ServedNames
from mlx_serve.server.registry import Registry, Slot
from mlx_serve.server.writer import send_json


class ModelBusy(ServeError):
    status = 409


class AdminBody(msgspec.Struct):
    model: str


class Host(Protocol):
    """What these routes read of the app (server.app.App)."""

    registry: Registry
    config: Config
    created: int

    @property
    def engine(self) -> EngineClient: ...

    def names(self, slot: Slot | None = None) -> ServedNames: ...

    async def read_body(self, scope: Scope, receive: Receive) -> bytes: ...


class ModelRoutes:
    """Model listing, health and the admin API, read from the app's registry."""

    def __init__(self, app: Host) -> None:
        self.app = app
        self.registry = app.registry

    def admin_routes(self, errors: ErrorFormat) -> list[Route]:
        if self.registry.single:
            return []
        return [
            Route("GET", "/models", self.admin_list, errors),
            Route("POST", "/models/load", self.admin_load, errors),
            Route("POST", "/models/unload", self.admin_unload, errors),
            Route("GET", "/models/sse", self.admin_events, errors),
        ]

    # -- health and stats ---------------------------------------------------------------------

    async def health(self, scope: Scope, receive: Receive, send: Send) -> None:
        registry = self.registry
        if not registry.single:
            states = {s.name: s.state for s in registry.slots.values()}
            serving = any(state != "failed" for state in states.values())
            body: dict[str, object] = {"status": "ok" if serving else "unavailable", "models": states}
            await send_json(send, 200 if serving else 503, orjson.dumps(body))
            return
        engine = self.app.engine
        if engine.state is EngineState.READY:
            await send_json(send, 200, b'{"status":"ok"}')
            return
        body = {
            "status": "loading" if engine.state is EngineState.LOADING else "unavailable",
            "error": engine.error,
        }
        retry = [(b"retry-after", str(RETRY_AFTER_LOADING_S).encode())]
        await send_json(send, 503, orjson.dumps(body), retry)

    async def stats(self) -> dict[str, Any]:
        """/stats of a many-model server: each loaded model's engine counters."""
        out: dict[str, Any] = {}
        for slot in self.registry.slots.values():
            entry: dict[str, Any] = {"state": slot.state}
            if slot.engine is not None and slot.engine.ready:
                with contextlib.suppress(Exception):
                    entry.update(await slot.engine.stats())
            out[slot.name] = entry
        default = self.registry.default.engine  # the status page reads the default model's state
        return {"state": default.state.value if default else "stopped", "models": out}

    # -- /v1/models -------------------------------------------------------------------------------

    def _cards(self, scope: Scope) -> list[dict[str, Any]]:
        """One entry per listed name, with the context a request may use (OpenAI's shape, plus
        the fields vLLM, llama.cpp and LM Studio clients read; Anthropic's for Anthropic SDKs);
        a many-model server adds each model's state and memory."""
        created = self.app.created
        out = []
        for slot in self.registry.slots.values():
            context, extra = self._facts(slot)
            names = self.app.names(slot).listed
            for n in names:
                if _speaks_anthropic(scope):
                    limits = {"max_input_tokens": context, "max_tokens": context, "lifecycle": "active"}
                    card = {
                        "type": "model",
                        "id": n,
                        "display_name": n,
                        "created_at": _iso(created),
                        **limits,
                    }
                else:
                    sizes = {
                        "context_length": context,
                        "max_model_len": context,
                        "max_context_length": context,
                    }
                    card = {"id": n, "object": "model", "created": created, "owned_by": "mlx-serve", **sizes}
                out.append({**card, **extra})
        return out

    def _facts(self, slot: Slot) -> tuple[int | None, dict[str, Any]]:
        """A model's context (its engine's plan once loaded, else its config's positions) and,
        on a many-model server, its state and memory."""
        model = slot.engine.model if slot.engine is not None else None
        if self.registry.single:
            return (model.context_length if model else None), {}
        self.registry.need_of(slot)
        need = slot.need
        context = model.context_length if model else (need.max_position if need else None)
        memory = {
            "budget_bytes": slot.allotted or None,
            "weights_bytes": need.weights_bytes if need else None,
        }
        return context, {"state": slot.state, "pinned": slot.entry.pinned, "memory": memory}

    async def models(self, scope: Scope, receive: Receive, send: Send) -> None:
        cards = self._cards(scope)
        body: dict[str, object] = {"object": "list", "data": cards}
        if _speaks_anthropic(scope):
            body = {"data": cards, "has_more": False, "first_id": cards[0]["id"], "last_id": cards[-1]["id"]}
        await send_json(send, 200, orjson.dumps(body))

    async def model_one(self, scope: Scope, receive: Receive, send: Send) -> None:
        wanted = scope["path_params"]["model_id"]
        card = self._card_of(wanted, scope)
        card = {**card, "id": wanted}
        if _speaks_anthropic(scope):
            card["display_name"] = wanted
        await send_json(send, 200, orjson.dumps(card))

    def _card_of(self, wanted: str, scope: Scope) -> dict[str, Any]:
        if self.registry.single:
            names = self.app.names()
            if not names.accepts(wanted):
                raise ModelNotFound(names.refusal(wanted), param="model")
            return self._cards(scope)[0]
        slot = self._slot(wanted)
        return next(c for c in self._cards(scope) if c["id"] == slot.name)

    def _slot(self, name: str) -> Slot:
        slot = self.registry.resolve(name)
        if slot is None or not name:
            raise ModelNotFound(self.registry.refusal(name), param="model")
        return slot

    # -- Ollama's lists ----------------------------------------------------------------------------

    async def ollama_tags(self, scope: Scope, receive: Receive, send: Send) -> None:
        names = [(n, s) for s in self.registry.slots.values() for n in s.names().listed]
        await send_json(send, 200, orjson.dumps({"models": [entry(n, _facts_of(s)) for n, s in names]}))

    async def ollama_ps(self, scope: Scope, receive: Receive, send: Send) -> None:
        models = []
        for slot in self.registry.slots.values():
            if slot.state == "loaded":
                context, _ = self._facts(slot)
                models.append(loaded(slot.name, _facts_of(slot), context))
        await send_json(send, 200, orjson.dumps({"models": models}))

    async def ollama_version(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, orjson.dumps({"version": OLLAMA_VERSION}))

    # -- admin ---------------------------------------------------------------------------------------

    async def admin_list(self, scope: Scope, receive: Receive, send: Send) -> None:
        data = []
        for slot in self.registry.slots.values():
            context, extra = self._facts(slot)
            e = slot.entry
            data.append(
                {
                    "id": slot.name, "object": "model", "owned_by": "mlx-serve", "created": self.app.created,
                    "aliases": list(e.aliases), "source": e.source, "context_length": context,
                    "status": {"value": slot.state, "error": slot.engine.error if slot.engine else None},
                    "pid": getattr(slot.engine, "pid", None) or None,  # its engine process
                    **extra,
                }
            )  # fmt: skip
        await send_json(send, 200, orjson.dumps({"object": "list", "data": data}))

    async def _admin_slot(self, scope: Scope, receive: Receive) -> Slot:
        body = await self.app.read_body(scope, receive)
        try:
            name = msgspec.json.decode(body, type=AdminBody).model
        except msgspec.DecodeError as exc:
            raise InvalidRequest(f'the body must be {{"model": NAME}}: {exc}', param="model") from None
        return self._slot(name)

    async def admin_load(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Start loading a model (room made first); progress on GET /models/sse."""
        slot = await self._admin_slot(scope, receive)
        self.registry.load(slot)
        await send_json(send, 200, orjson.dumps({"success": True, "model": slot.name, "status": slot.state}))

    async def admin_unload(self, scope: Scope, receive: Receive, send: Send) -> None:
        slot = await self._admin_slot(scope, receive)
        engine = slot.engine
        if slot.holds or (engine is not None and engine.gate.inflight):
            raise ModelBusy(f"model '{slot.name}' has requests in flight; unload it when they end")
        self.registry.unload(slot)
        await send_json(send, 200, orjson.dumps({"success": True, "model": slot.name, "status": slot.state}))

    async def admin_events(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Server-sent events: each model's state now, then every change, until the client leaves."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        for slot in self.registry.slots.values():
            queue.put_nowait({"model": slot.name, "status": slot.state})
        self.registry.watchers.append(queue)
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await receive()  # the (empty) request body; the next message is the client leaving
        left = asyncio.ensure_future(receive())
        try:
            while True:
                got = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait(
                    {got, left}, timeout=self.app.config.heartbeat_s, return_when="FIRST_COMPLETED"
                )
                if left in done:
                    got.cancel()
                    return
                chunk = (
                    b"data: " + orjson.dumps(got.result()) + b"\n\n" if got in done else b": keep-alive\n\n"
                )
                if got not in done:
                    got.cancel()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            self.registry.watchers.remove(queue)
            left.cancel()


def _facts_of(slot: Slot) -> ModelFacts | None:
    """What the slot's loaded engine read of its model's files (None before it loads)."""
    model = slot.engine.model if slot.engine is not None else None
    return model.facts if model is not None else None


def _speaks_anthropic(scope: Scope) -> bool:
    return any(name == b"anthropic-version" for name, _ in scope.get("headers", []))


def _iso(unix: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))
