"""Tier 2: mlx_lm.server's `adapters` field through the app, over fake engines: honoured for the
adapter the requested model is served with (`--adapter-path` on a one-model server, a
`base:NAME` model on a many-model one), a 400 naming the field for any other folder."""

from __future__ import annotations

from typing import Any

import orjson

from mlx_serve.engine.host.client import EngineClient
from mlx_serve.server.app import App
from mlx_serve.server.config import Config
from mlx_serve.server.models_file import ModelEntry, with_adapters
from mlx_serve.server.registry import Need, Registry, Slot
from tests.support.asgi import Reply, call, run_registry
from tests.support.fake_engine import fake_engine

SQL = "/srv/adapters/sql"


def chat(model: str, adapters: str) -> bytes:
    messages = [{"role": "user", "content": "hi"}]
    return orjson.dumps({"model": model, "messages": messages, "max_tokens": 20, "adapters": adapters})


def many() -> App:
    def make(entry: ModelEntry, share: int | None) -> EngineClient:
        return fake_engine([f"I am {entry.name}", "."])[0]

    def estimate(entry: ModelEntry) -> Need:
        return Need(1 << 30, 0, 0, 4096)

    entries = with_adapters([ModelEntry(name="base", adapters=(("sql", SQL),))])
    return App(Config(), Registry([Slot(e) for e in entries], make, 8 << 30, estimate, 0.0))


def refused(reply: Reply) -> str:
    assert reply.status == 400, reply.body
    error: dict[str, Any] = reply.json()["error"]
    assert error["param"] == "adapters"
    return str(error["message"])


def test_a_base_name_model_takes_its_own_adapter_folder_and_refuses_others() -> None:
    async def test(app: App) -> None:
        ok = await call(app, "POST", "/v1/chat/completions", chat("base:sql", SQL))
        assert ok.status == 200 and ok.json()["choices"][0]["message"]["content"] == "I am base:sql."
        other = refused(
            await call(app, "POST", "/v1/chat/completions", chat("base:sql", "/srv/adapters/other"))
        )
        assert "/srv/adapters/other" in other and SQL in other
        completion = orjson.dumps({"model": "base", "prompt": "hi", "adapters": SQL})
        plain = refused(await call(app, "POST", "/v1/completions", completion))
        assert "served without an adapter" in plain and '"BASE:NAME"' in plain

    run_registry(many(), test)


def test_a_one_model_server_takes_the_folder_of_its_adapter_path() -> None:
    engine, _ = fake_engine(["I am adapted", "."])
    app = App(Config(adapter_path=SQL), engine)

    async def test(app: App) -> None:
        await engine.wait_ready()
        ok = await call(app, "POST", "/v1/chat/completions", chat("default", SQL + "/"))
        assert ok.status == 200 and ok.json()["choices"][0]["message"]["content"] == "I am adapted."
        assert "--adapter-path" in refused(
            await call(app, "POST", "/v1/chat/completions", chat("default", "/x"))
        )

    run_registry(app, test)
