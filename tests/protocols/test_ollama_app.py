"""Tier 2: Ollama's routes through the whole app with the fake engine (the real core and
scheduler, a scripted runner): NDJSON framing, heartbeats, in-band errors, Ollama's envelope."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import orjson
import pytest

from mlx_serve.engine.host.thread import ThreadEngine
from mlx_serve.server.app import App
from mlx_serve.server.config import Config
from tests.support.asgi import Reply, call
from tests.support.fake_engine import FakeTokenizer, fake_engine

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "options": {"num_predict": 8}}


async def serving(engine: ThreadEngine, **config: Any) -> App:
    app = App(Config(**config), engine)
    engine.start()
    await engine.wait_ready()
    return app


def lines(reply: Reply) -> list[dict[str, Any]]:
    assert reply.body.endswith(b"\n")
    return [orjson.loads(line) for line in reply.body.splitlines()]


def chat(engine: ThreadEngine, body: dict[str, Any] = CHAT, **config: Any) -> Reply:
    async def go() -> Reply:
        app = await serving(engine, **config)
        return await call(app, "POST", "/api/chat", orjson.dumps(body))

    return asyncio.run(go())


def test_chat_streams_ndjson_lines_then_done() -> None:
    engine, _ = fake_engine(["a", "b", "c"])
    r = chat(engine)
    assert r.status == 200 and r.headers["content-type"] == "application/x-ndjson"
    out = lines(r)
    assert "".join(line["message"]["content"] for line in out) == "abc"
    assert out[-1]["done"] is True and out[-1]["done_reason"] == "stop" and out[-1]["eval_count"] == 4
    assert all(line["done"] is False for line in out[:-1])


def test_quiet_engine_gets_empty_lines_not_comments() -> None:
    engine, _ = fake_engine(["a", "b"], step_s=0.3)
    out = lines(chat(engine, heartbeat_s=0.1))
    beats = [line for line in out if not line["done"] and line["message"]["content"] == ""]
    assert beats and "".join(line["message"]["content"] for line in out) == "ab"


def test_engine_fault_mid_stream_is_an_error_line_last() -> None:
    engine, _ = fake_engine(["a", "b", "c"], fail_after=1)
    out = lines(chat(engine))
    assert out[0]["message"]["content"] == "a"
    assert "simulated engine fault" in out[-1]["error"] and "done" not in out[-1]


def test_engine_fault_before_any_token_is_a_500_in_ollamas_shape() -> None:
    engine, _ = fake_engine(["a"], fail_after=0)
    r = chat(engine, {**CHAT, "stream": False})
    assert r.status == 500 and set(r.json()) == {"error"}


def test_unknown_api_paths_and_methods_answer_in_ollamas_shape() -> None:
    engine, _ = fake_engine(["a"])

    async def go() -> tuple[Reply, Reply]:
        app = await serving(engine)
        return await call(app, "POST", "/api/pull", b"{}"), await call(app, "GET", "/api/chat")

    missing, wrong = asyncio.run(go())
    assert missing.status == 404 and set(missing.json()) == {"error"}
    assert wrong.status == 405 and set(wrong.json()) == {"error"} and wrong.headers["allow"] == "POST"


def test_tokenizing_runs_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The token tools and Ollama's routes template and tokenize in a worker thread, as the
    generation routes do: the loop keeps answering while a big body is read."""
    engine, _ = fake_engine(["a"], context=4096)
    threads: list[int] = []
    render = FakeTokenizer.apply_chat_template

    def recording(self: FakeTokenizer, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return render(self, *args, **kwargs)

    monkeypatch.setattr(FakeTokenizer, "apply_chat_template", recording)
    huge = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "x" * 5_000_000}]})

    async def go() -> tuple[list[int], int]:
        app = await serving(engine)
        statuses = []
        for path in ("/tokenize", "/v1/chat/completions/input_tokens", "/api/chat"):
            task = asyncio.create_task(call(app, "POST", path, huge, timeout_s=60))
            while not task.done():
                assert (await call(app, "GET", "/health")).status == 200
                await asyncio.sleep(0.005)
            statuses.append((await task).status)
        return statuses, threading.get_ident()

    statuses, loop_thread = asyncio.run(go())
    assert statuses == [400, 400, 400]  # longer than the context: refused, after the work
    assert len(threads) >= 3 and loop_thread not in threads
