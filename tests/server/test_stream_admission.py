"""Tier 2: a streamed answer's first events wait for the engine to admit the request (what the
prefix cache served it is then known, and Anthropic's message_start reports it): the head goes
out at once, SSE comments keep a queued request's connection alive, and a client that leaves
while queued ends its request. Through the real app and writer, a fake engine of one row."""

from __future__ import annotations

import asyncio

import orjson

from mlx_serve.engine.host.thread import ThreadEngine
from mlx_serve.server.app import App
from mlx_serve.server.config import Config
from tests.support.asgi import Reply, call, wait_until
from tests.support.fake_engine import fake_engine

PIECES = [f"t{i} " for i in range(12)]


def messages(max_tokens: int) -> bytes:
    return orjson.dumps(
        {
            "model": "fake-model",
            "max_tokens": max_tokens,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    )


def one_row() -> ThreadEngine:
    engine, _ = fake_engine(PIECES, step_s=0.05, max_running=1)  # a second request waits its turn
    return engine


async def app_of(engine: ThreadEngine) -> App:
    app = App(Config(heartbeat_s=0.05), engine)
    engine.start()
    await app.engine.wait_ready()
    return app


def frames(reply: Reply) -> list[str]:
    """Each SSE frame's first line: `: keep-alive` for a comment, else its `event:` line."""
    return [raw.split("\n")[0] for raw in reply.body.decode().split("\n\n") if raw]


def test_a_queued_stream_gets_comments_then_message_start_with_its_usage() -> None:
    engine = one_row()

    async def go() -> tuple[Reply, Reply]:
        app = await app_of(engine)
        first = asyncio.create_task(call(app, "POST", "/v1/messages", messages(12)))
        await wait_until(lambda: engine.counters.num_requests_running == 1)
        second = await call(app, "POST", "/v1/messages", messages(2))
        return await first, second

    first, second = asyncio.run(go())
    assert second.status == 200
    seen = frames(second)
    start = seen.index("event: message_start")
    assert start >= 3 and set(seen[:start]) == {": keep-alive"}  # queued ~0.6 s behind the first
    assert seen[-1] == "event: message_stop"
    head = orjson.loads(second.sse_data()[0])["message"]
    usage = head["usage"]
    assert usage["cache_read_input_tokens"] == 0  # the fake engine has no prefix cache
    assert usage["input_tokens"] > 0
    assert frames(first)[0] == "event: message_start"  # admitted at once: no wait before it


def test_a_client_that_leaves_while_queued_ends_its_request() -> None:
    engine = one_row()

    async def go() -> Reply:
        app = await app_of(engine)
        first = asyncio.create_task(call(app, "POST", "/v1/messages", messages(12)))
        await wait_until(lambda: engine.counters.num_requests_running == 1)
        left = await call(app, "POST", "/v1/messages", messages(12), disconnect_after_s=0.15)
        await first
        await wait_until(lambda: engine.gate.inflight == 0)
        return left

    left = asyncio.run(go())
    seen = frames(left)
    assert seen[:2] == [": keep-alive"] * 2 and "event: content_block_start" not in seen
    assert engine.counters.requests_finished == 1  # only the first ran
    assert engine.counters.requests_aborted == 1
