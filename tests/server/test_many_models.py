"""Tier 2: a many-model server's app with fake engines: the request's model picks the engine on
every wire format, loads on demand within the memory budget, unloads the least recently used idle
model, never one with requests in flight or a pinned one, idle unload, and the admin API."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import orjson

from mlx_serve.engine.host.client import EngineClient
from mlx_serve.server.app import App
from mlx_serve.server.budget import Need
from mlx_serve.server.cli import serving_stack
from mlx_serve.server.config import Config
from mlx_serve.server.models_file import ModelEntry
from mlx_serve.server.registry import Registry, Slot
from mlx_serve.server.shutdown import Drain
from tests.support.asgi import Reply, call, run_registry, wait_until
from tests.support.fake_engine import fake_engine

GIB = 1 << 30
KEY = (b"authorization", b"Bearer k")


def chat(model: str | None, stream: bool = False) -> bytes:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}
    if model is not None:
        body["model"] = model
    return orjson.dumps({**body, "stream": stream})


def many(
    entries: list[ModelEntry],
    budget: int = 4 * GIB,
    need: int = GIB,
    step_s: float = 0.0,
    idle_s: float = 0.0,
    gate: threading.Event | None = None,
    load_error: str | None = None,
) -> tuple[App, list[str]]:
    """An app over fake engines, each answering its own model's name; `built` records loads;
    models after the first wait for `gate` to load, or fail with `load_error`."""
    built: list[str] = []

    def make(entry: ModelEntry, share: int | None) -> EngineClient:
        later = bool(built)
        built.append(entry.name)
        engine, _ = fake_engine(
            [f"I am {entry.name}", "."],
            step_s=step_s,
            load_gate=gate if later else None,
            load_error=load_error if later else None,
        )
        return engine

    def estimate(entry: ModelEntry) -> Need:
        return Need(need, 0, 0, 4096)

    registry = Registry([Slot(e) for e in entries], make, budget, estimate, idle_s)
    return App(Config(heartbeat_s=0.05), registry), built


def text(reply: Reply) -> str:
    return str(reply.json()["choices"][0]["message"]["content"])


def states(reply: Reply) -> dict[str, str]:
    return {c["id"]: c["state"] for c in reply.json()["data"]}


TWO = [ModelEntry(name="alpha", aliases=("a-*",)), ModelEntry(name="beta", source="/models/beta")]


def test_the_requests_model_picks_the_engine_on_every_format() -> None:
    app, built = many(TWO)

    async def test(app: App) -> None:
        assert text(await call(app, "POST", "/v1/chat/completions", chat("beta"))) == "I am beta."
        assert text(await call(app, "POST", "/v1/chat/completions", chat(None))) == "I am alpha."
        assert text(await call(app, "POST", "/v1/chat/completions", chat("a-1"))) == "I am alpha."
        assert text(await call(app, "POST", "/v1/chat/completions", chat("/models/beta"))) == "I am beta."
        reply = await call(app, "POST", "/v1/chat/completions", chat("beta", stream=True))
        assert "I am beta" in reply.body.decode()
        messages = {"model": "beta", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}
        reply = await call(app, "POST", "/v1/messages", orjson.dumps(messages))
        assert reply.json()["content"][0]["text"] == "I am beta." and reply.json()["model"] == "beta"
        ollama = {"model": "beta:latest", "stream": False, "messages": [{"role": "user", "content": "hi"}]}
        reply = await call(app, "POST", "/api/chat", orjson.dumps(ollama))
        assert reply.json()["message"]["content"] == "I am beta."
        counted = await call(app, "POST", "/v1/messages/count_tokens", orjson.dumps(messages))
        assert counted.status == 200 and counted.json()["input_tokens"] > 0

    run_registry(app, test)
    assert built == ["alpha", "beta"]  # the default at start, beta on its first request


def test_an_unknown_model_is_each_formats_404() -> None:
    app, _ = many(TWO)

    async def test(app: App) -> None:
        reply = await call(app, "POST", "/v1/chat/completions", chat("gpt-4"))
        assert reply.status == 404 and reply.json()["error"]["code"] == "model_not_found"
        assert "alpha, beta" in reply.json()["error"]["message"]
        body = {"model": "gpt-4", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        reply = await call(app, "POST", "/v1/messages", orjson.dumps(body))
        assert reply.status == 404 and reply.json()["type"] == "error"
        reply = await call(app, "POST", "/api/chat", orjson.dumps({**body, "stream": False}))
        assert reply.status == 404 and "gpt-4" in reply.json()["error"]
        assert (await call(app, "GET", "/v1/models/gpt-4")).status == 404

    run_registry(app, test)


def test_models_list_their_state_context_and_memory() -> None:
    app, _ = many(TWO)

    async def test(app: App) -> None:
        await app.registry.ensure(app.registry.default)
        listed = (await call(app, "GET", "/v1/models")).json()["data"]
        assert [c["id"] for c in listed] == ["alpha", "beta"]
        assert states(await call(app, "GET", "/v1/models")) == {"alpha": "loaded", "beta": "unloaded"}
        beta = next(c for c in listed if c["id"] == "beta")
        assert beta["context_length"] == 4096 and beta["memory"]["weights_bytes"] == GIB
        anthropic = await call(app, "GET", "/v1/models", headers=[(b"anthropic-version", b"2023-06-01")])
        assert [c["id"] for c in anthropic.json()["data"]] == ["alpha", "beta"]
        tags = (await call(app, "GET", "/api/tags")).json()["models"]
        assert [t["name"] for t in tags] == ["alpha:latest", "beta:latest"]
        ps = (await call(app, "GET", "/api/ps")).json()["models"]
        assert [p["name"] for p in ps] == ["alpha:latest"]
        health = await call(app, "GET", "/health")
        assert health.status == 200 and health.json()["models"] == {"alpha": "loaded", "beta": "unloaded"}

    run_registry(app, test)


def test_the_least_recently_used_idle_model_makes_room() -> None:
    entries = [*TWO, ModelEntry(name="gamma")]
    app, built = many(entries, budget=2 * GIB, need=GIB)

    async def test(app: App) -> None:
        for name in ("alpha", "beta", "alpha", "gamma"):  # beta is the least recently used now
            assert text(await call(app, "POST", "/v1/chat/completions", chat(name))) == f"I am {name}."
        assert states(await call(app, "GET", "/v1/models")) == {
            "alpha": "loaded", "beta": "unloaded", "gamma": "loaded",
        }  # fmt: skip

    run_registry(app, test)
    assert built == ["alpha", "beta", "gamma"]


def test_a_model_with_a_request_running_is_never_unloaded_under_it() -> None:
    app, _ = many(TWO, budget=GIB, need=GIB, step_s=0.3)

    async def test(app: App) -> None:
        await app.registry.ensure(app.registry.default)
        long = asyncio.create_task(call(app, "POST", "/v1/chat/completions", chat("alpha")))
        await wait_until(lambda: app.registry.default.holds == 1)
        refused = await call(app, "POST", "/v1/chat/completions", chat("beta"))
        assert refused.status == 503 and "busy or pinned" in refused.json()["error"]["message"]
        assert text(await long) == "I am alpha."
        assert text(await call(app, "POST", "/v1/chat/completions", chat("beta"))) == "I am beta."

    run_registry(app, test)


def test_a_model_that_cannot_fit_is_a_503_naming_the_memory() -> None:
    app, _ = many(TWO, budget=GIB, need=3 * GIB)

    async def test(app: App) -> None:
        reply = await call(app, "POST", "/v1/chat/completions", chat("beta"))
        message = reply.json()["error"]["message"]
        assert reply.status == 503 and "needs about 3.00 GiB" in message and "budget is 1.00 GiB" in message

    run_registry(app, test)


def test_pinned_models_stay_and_idle_ones_unload() -> None:
    entries = [ModelEntry(name="alpha", pinned=True), ModelEntry(name="beta"), ModelEntry(name="gamma")]
    app, _ = many(entries, budget=2 * GIB, need=GIB, idle_s=0.3)

    async def test(app: App) -> None:
        assert text(await call(app, "POST", "/v1/chat/completions", chat("beta"))) == "I am beta."
        assert states(await call(app, "GET", "/v1/models"))["beta"] == "loaded"
        # gamma does not fit beside pinned alpha and beta: beta goes, alpha stays
        assert text(await call(app, "POST", "/v1/chat/completions", chat("gamma"))) == "I am gamma."
        assert states(await call(app, "GET", "/v1/models")) == {
            "alpha": "loaded", "beta": "unloaded", "gamma": "loaded",
        }  # fmt: skip
        await wait_until(lambda: app.registry.slots["gamma"].state == "unloaded", timeout_s=3)
        assert app.registry.slots["alpha"].state == "loaded"  # pinned: past its idle time too

    run_registry(app, test)


def test_sweep_unloads_only_past_the_idle_limit() -> None:
    entries = [ModelEntry(name="alpha"), ModelEntry(name="beta", idle_unload_s=0)]
    app, _ = many(entries, idle_s=60)

    async def test(app: App) -> None:
        for slot in app.registry.slots.values():
            await app.registry.ensure(slot)
        now = time.monotonic()
        assert app.registry.sweep(now + 30) == []
        assert app.registry.sweep(now + 61) == ["alpha"]  # beta's own 0: never

    run_registry(app, test)


def test_admin_load_unload_and_progress_events() -> None:
    app, _ = many(TWO)

    async def test(app: App) -> None:
        events = asyncio.create_task(call(app, "GET", "/models/sse", disconnect_after_s=2))
        await wait_until(lambda: len(app.registry.watchers) == 1)
        loaded = await call(app, "POST", "/models/load", b'{"model": "beta"}')
        assert loaded.status == 200 and loaded.json()["success"] is True
        await app.registry.ensure(app.registry.slots["beta"])
        listed = (await call(app, "GET", "/models")).json()["data"]
        assert {m["id"]: m["status"]["value"] for m in listed}["beta"] == "loaded"
        unloaded = await call(app, "POST", "/models/unload", b'{"model": "beta"}')
        assert unloaded.status == 200 and app.registry.slots["beta"].state == "unloaded"
        seen = [orjson.loads(d) for d in (await events).sse_data()]
        beta = [e["status"] for e in seen if e["model"] == "beta"]
        assert beta == ["unloaded", "loading", "ready", "unloaded"]
        missing = await call(app, "POST", "/models/load", b'{"model": "nope"}')
        assert missing.status == 404

    run_registry(app, test)


def test_a_stream_waiting_for_its_model_gets_heartbeats_then_its_answer() -> None:
    gate = threading.Event()
    app, _ = many(TWO, gate=gate)

    async def test(app: App) -> None:
        await app.registry.ensure(app.registry.default)
        answer = asyncio.create_task(call(app, "POST", "/v1/chat/completions", chat("beta", stream=True)))
        await asyncio.sleep(0.4)
        gate.set()
        reply = await answer
        assert reply.status == 200 and reply.body.startswith(b": loading the model\n\n: loading")
        pieces = [orjson.loads(d) for d in reply.sse_data() if d != "[DONE]"]
        assert "".join(p["choices"][0]["delta"].get("content") or "" for p in pieces) == "I am beta."
        assert reply.sse_data()[-1] == "[DONE]"

    run_registry(app, test)


def test_a_model_that_fails_to_load_is_an_error_event_on_a_stream_and_a_503_without() -> None:
    app, _ = many(TWO, load_error="no weights here")

    async def test(app: App) -> None:
        await app.registry.ensure(app.registry.default)
        reply = await call(app, "POST", "/v1/chat/completions", chat("beta", stream=True))
        assert reply.status == 200 and b"event: error\ndata: " in reply.body
        error = orjson.loads(reply.sse_data()[-1])["error"]
        assert "no weights here" in error["message"]
        plain = await call(app, "POST", "/v1/chat/completions", chat("beta"))
        assert plain.status == 503 and "no weights here" in plain.json()["error"]["message"]
        assert text(await call(app, "POST", "/v1/chat/completions", chat("alpha"))) == "I am alpha."

    run_registry(app, test)


def test_the_loaders_fetching_and_converting_lines_are_progress_events() -> None:
    gate = threading.Event()
    app, _ = many(TWO, gate=gate)
    loader = logging.getLogger("mlx_serve.loader")
    level = loader.level
    loader.setLevel(logging.INFO)

    async def test(app: App) -> None:
        await app.registry.ensure(app.registry.default)
        events = asyncio.create_task(call(app, "GET", "/models/sse", disconnect_after_s=2))
        await wait_until(lambda: len(app.registry.watchers) == 1)
        assert (await call(app, "POST", "/models/load", b'{"model": "beta"}')).status == 200
        said = threading.Thread(target=loader.info, args=("converting beta.gguf to MLX in /cache",))
        said.start()
        said.join()
        await asyncio.sleep(0.1)  # the line reaches the loop, then the load may end
        gate.set()
        seen = [orjson.loads(d) for d in (await events).sse_data()]
        assert {
            "model": "beta",
            "status": "converting",
            "detail": "converting beta.gguf to MLX in /cache",
        } in seen
        assert [e["status"] for e in seen if e["model"] == "beta"][-1] == "ready"

    try:
        run_registry(app, test)
    finally:
        loader.setLevel(level)


def test_the_admin_api_is_behind_the_api_key() -> None:
    app, _ = many(TWO)
    app.config.api_key = "k"
    stack, _ = serving_stack(app, app.config, Drain())

    async def test(app: App) -> None:
        for method, path in (("GET", "/models"), ("POST", "/models/load"), ("POST", "/models/unload")):
            assert (await call(stack, method, path, b'{"model": "beta"}')).status == 401
        assert (await call(stack, "GET", "/models", headers=[KEY])).status == 200
        assert (await call(stack, "GET", "/health")).status == 200  # /health stays open
        assert app.registry.slots["beta"].state == "unloaded"

    run_registry(app, test)


def test_a_model_of_unknown_need_takes_an_even_share() -> None:
    app, _ = many([*TWO, ModelEntry(name="gamma")], budget=3 * GIB, need=0)

    async def test(app: App) -> None:
        for name in ("alpha", "beta", "gamma"):
            await app.registry.ensure(app.registry.slots[name])
        assert [s.allotted for s in app.registry.slots.values()] == [GIB, GIB, GIB]

    run_registry(app, test)


async def socket_turn(app: App, message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Responses turn over a WebSocket: the events it sends back."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    inbox.put_nowait({"type": "websocket.connect"})
    inbox.put_nowait({"type": "websocket.receive", "text": orjson.dumps(message).decode()})
    out: list[dict[str, Any]] = []

    async def send(sent: dict[str, Any]) -> None:
        if sent["type"] == "websocket.send":
            out.append(orjson.loads(sent["text"]))
            if out[-1]["type"] in ("response.completed", "error"):
                inbox.put_nowait({"type": "websocket.disconnect", "code": 1000})

    scope = {"type": "websocket", "path": "/v1/responses", "headers": [], "query_string": b""}
    await asyncio.wait_for(app(scope, inbox.get, send), 10)
    return out


def test_a_responses_socket_turn_goes_to_the_model_it_names() -> None:
    app, _ = many(TWO)

    async def test(app: App) -> None:
        turn = {"type": "response.create", "model": "beta", "input": "hi", "max_output_tokens": 20}
        events = await socket_turn(app, turn)
        done = events[-1]
        assert done["type"] == "response.completed" and done["response"]["model"] == "beta"
        assert done["response"]["output"][0]["content"][0]["text"] == "I am beta."
        refused = await socket_turn(app, {**turn, "model": "gpt-4"})
        assert refused[-1]["type"] == "error" and refused[-1]["status"] == 404

    run_registry(app, test)
