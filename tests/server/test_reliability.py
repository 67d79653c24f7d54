"""Tier 2: one bad request hurts only itself, through the whole server (issue 15).

The ASGI app with the fake engine (the real core and scheduler, a scripted runner), driven by
hand: validation before admission, chat_template_kwargs, deep nesting, body limits and
Content-Type, one admission owner under bursts, and the event loop kept for I/O.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest

from mlx_serve.engine.host.thread import ThreadEngine
from mlx_serve.server.app import App
from mlx_serve.server.config import Config
from tests.support.asgi import Reply, call, wait_until
from tests.support.fake_engine import FakeTokenizer, fake_engine

USER = [{"role": "user", "content": "hi"}]
ROUTES = {  # a minimal valid body of each generation route, and whether it speaks Anthropic
    "/v1/chat/completions": ({"messages": USER, "max_tokens": 8}, False),
    "/v1/completions": ({"prompt": "hi", "max_tokens": 8}, False),
    "/v1/messages": ({"model": "fake-model", "messages": USER, "max_tokens": 8}, True),
    "/v1/responses": ({"input": "hi", "max_output_tokens": 8}, False),
}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def serving(engine: ThreadEngine, **config: Any) -> App:
    app = App(Config(**config), engine)
    engine.start()
    await engine.wait_ready()
    return app


def post(app: App, path: str, body: dict[str, Any] | bytes, **kw: Any) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()  # ints past 64 bits too
    return call(app, "POST", path, raw, **kw)


def error_of(reply: Reply, anthropic: bool) -> dict[str, Any]:
    body = reply.json()
    if anthropic:
        assert body["type"] == "error"
    return dict(body["error"])


BAD_FIELDS = [
    ({"seed": -1}, "seed"),  # item 1: wedged the engine
    ({"seed": 2**64}, "seed"),
    ({"seed": 2**64 - 1, "n": 2}, "seed"),  # the second choice's seed would be 2^64
    ({"top_k": 10**12}, "top_k"),  # item 3: failed the whole batch
    ({"repetition_context_size": 2**63 - 1}, "repetition_context_size"),
    ({"presence_context_size": 10**12}, "presence_context_size"),
    ({"frequency_context_size": 10**12}, "frequency_context_size"),
]


@pytest.mark.parametrize(("fields", "param"), BAD_FIELDS, ids=[p for _, p in BAD_FIELDS])
def test_bad_field_is_400_before_admission_and_a_running_stream_is_untouched(
    fields: dict[str, Any], param: str
) -> None:
    engine, _ = fake_engine([f"t{i} " for i in range(30)], step_s=0.005)
    long = {"messages": USER, "max_tokens": 30, "stream": True}

    async def go() -> tuple[Reply, Reply, Reply, int]:
        app = await serving(engine)
        running = asyncio.create_task(post(app, "/v1/chat/completions", long))
        await wait_until(lambda: engine.counters.requests_started == 1)
        started = engine.counters.requests_started
        bad = await post(app, "/v1/chat/completions", {"messages": USER, "temperature": 1, **fields})
        after = engine.counters.requests_started - started
        return (
            bad,
            await running,
            await post(app, "/v1/chat/completions", ROUTES["/v1/chat/completions"][0]),
            after,
        )

    bad, stream, later, admitted = run(go())
    err = error_of(bad, False)
    assert bad.status == 400 and err["param"] == param and err["type"] == "invalid_request_error"
    assert admitted == 0  # the engine never saw it
    frames = stream.sse_data()
    assert frames[-1] == "[DONE]" and not any('"error"' in f for f in frames)
    assert later.status == 200


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
def test_bad_top_k_is_400_in_every_format(path: str) -> None:
    engine, _ = fake_engine(["a"])
    body, anthropic = ROUTES[path]

    async def go() -> Reply:
        return await post(await serving(engine), path, {**body, "top_k": 10**12, "temperature": 1})

    reply = run(go())
    assert reply.status == 400 and "top_k" in error_of(reply, anthropic)["message"]


@pytest.mark.parametrize(
    "hostile",
    [
        {"return_tensors": "np"},
        {"return_tensors": "pt"},
        {"return_tensors": "mlx"},
        {"truncation": True, "max_length": 2},
        {"padding": "max_length", "max_length": 4096},
        {"tokenize": False},
        {"return_dict": True},
        {"chat_template": "{{ 1/0 }}"},
    ],
    ids=lambda h: ",".join(h),
)
def test_chat_template_kwargs_reach_the_template_as_variables_only(hostile: dict[str, Any]) -> None:
    # Item 2: return_tensors orphaned the request and killed the engine on the next one.
    engine, _ = fake_engine(["a", "b"], templated=True)
    plain = {"messages": USER, "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}}
    asked = {**plain, "chat_template_kwargs": {"enable_thinking": False, **hostile}}

    async def go() -> tuple[Reply, Reply, Reply]:
        app = await serving(engine)
        path = "/v1/chat/completions"
        return await post(app, path, plain), await post(app, path, asked), await post(app, path, plain)

    before, reply, after = run(go())
    assert reply.status == 200 and after.status == 200
    assert reply.json()["usage"]["prompt_tokens"] == before.json()["usage"]["prompt_tokens"]


def with_nesting(body: dict[str, Any], depth: int) -> bytes:
    """`body` plus an unknown field nested `depth` arrays deep (json.dumps cannot write it)."""
    return (json.dumps(body)[:-1] + ', "unknown": ' + "[" * depth + "1" + "]" * depth + "}").encode()


@pytest.mark.parametrize("path", [*ROUTES, "/v1/messages/count_tokens"])
def test_deep_nesting_anywhere_is_400_in_the_routes_envelope(path: str) -> None:
    # Item 7: msgspec's RecursionError on 1000 levels, even in an unknown field, was a bare 500.
    engine, _ = fake_engine(["a"])
    body, anthropic = ROUTES.get(path, ROUTES["/v1/messages"])

    async def go() -> Reply:
        return await post(await serving(engine), path, with_nesting(body, 1200))

    reply = run(go())
    assert reply.status == 400 and "nests" in error_of(reply, anthropic or "messages" in path)["message"]


def deep_schema(levels: int) -> str:
    """A JSON schema `levels` JSON objects deep (two per property), as text."""
    return (
        '{"type": "object", "properties": {"a": ' * (levels // 2)
        + '{"type": "string"}'
        + "}}" * (levels // 2)
    )


@pytest.mark.parametrize(
    ("extra", "levels"),
    [
        ("tools", 600),  # item 7: tool parameters through the template's tojson
        ("tool_choice", 600),  # and through the forced-call grammar
        ("response_format", 2000),
    ],
)
def test_deep_schemas_are_400(extra: str, levels: int) -> None:
    engine, _ = fake_engine(["a"], templated=True)
    schema = deep_schema(levels)
    head = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, '
    if extra == "response_format":
        tail = (
            '"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": '
            + schema
            + "}}}"
        )
    else:
        tool = '{"type": "function", "function": {"name": "f", "parameters": ' + schema + "}}"
        tail = (
            '"tools": ['
            + tool
            + "]"
            + (', "tool_choice": "required"' if extra == "tool_choice" else "")
            + "}"
        )

    async def go() -> Reply:
        return await post(await serving(engine), "/v1/chat/completions", (head + tail).encode())

    reply = run(go())
    assert reply.status == 400, reply.body[:300]
    assert reply.json()["error"]["type"] == "invalid_request_error"


def test_content_length_over_the_limit_is_413_before_reading_the_body() -> None:
    # Item 9: `Content-Length: 10000000000` with no body was waited for.
    engine, _ = fake_engine(["a"])
    reads = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        await asyncio.Event().wait()
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def go() -> None:
        app = await serving(engine)
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "query_string": b"",
            "headers": [(b"content-length", b"10000000000"), (b"content-type", b"application/json")],
        }
        await asyncio.wait_for(app(scope, receive, send), 5)

    run(go())
    assert sent[0]["status"] == 413 and reads == 0
    assert b"10000000000" in sent[1]["body"]


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        (None, 200),
        (b"application/json", 200),
        (b"application/json; charset=utf-8", 200),
        (b"application/vnd.api+json", 200),
        (b"application/x-www-form-urlencoded", 200),  # curl -d's default
        (b"text/plain;charset=UTF-8", 200),
        (b"text/html", 415),
        (b"multipart/form-data; boundary=x", 415),
        (b"application/xml", 415),
        (b"application/octet-stream", 415),
        (b"application/json; charset=utf-16", 415),
    ],
)
def test_content_type_clearly_not_json_is_415_naming_the_header(
    content_type: bytes | None, status: int
) -> None:
    engine, _ = fake_engine(["a"])
    headers = [] if content_type is None else [(b"content-type", content_type)]

    async def go() -> tuple[Reply, Reply]:
        app = await serving(engine)
        chat = await post(app, "/v1/chat/completions", ROUTES["/v1/chat/completions"][0], headers=headers)
        return chat, await post(app, "/v1/messages", ROUTES["/v1/messages"][0], headers=headers)

    chat, messages = run(go())
    assert chat.status == messages.status == status
    if status == 415:
        assert (
            chat.json()["error"]["param"] == "Content-Type"
            and "Content-Type" in chat.json()["error"]["message"]
        )
        assert messages.json()["type"] == "error" and "Content-Type" in messages.json()["error"]["message"]


def test_a_body_that_never_ends_is_408_after_the_body_timeout() -> None:
    engine, _ = fake_engine(["a"])
    sent: list[dict[str, Any]] = []
    first = True

    async def receive() -> dict[str, Any]:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b'{"messages": [', "more_body": True}
        await asyncio.sleep(0.05)  # a trickle: every read brings a byte, the body never ends
        return {"type": "http.request", "body": b" ", "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def go() -> float:
        app = await serving(engine, body_timeout_s=0.3)
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "query_string": b"",
            "headers": [],
        }
        began = time.monotonic()
        await asyncio.wait_for(app(scope, receive, send), 5)
        return time.monotonic() - began

    took = run(go())
    assert sent[0]["status"] == 408 and b"did not arrive within 0.3 s" in sent[1]["body"]
    assert took < 3


def is_complete(reply: Reply, stream: bool, anthropic: bool) -> bool:
    """A 200 that ran to completion: its terminator, and no error inside."""
    if not stream:
        body = reply.json()
        finished = body.get("stop_reason") or body.get("status") in ("completed", "incomplete")
        return body.get("error") is None and bool(
            finished or body.get("choices", [{}])[0].get("finish_reason")
        )
    text = reply.body.decode()
    if 'data: {"error"' in text or "event: error" in text or "response.failed" in text:
        return False
    last_event = text.rsplit("event: ", 1)[-1].split("\n", 1)[0] if "event: " in text else ""
    return text.rstrip().endswith("[DONE]") or last_event in (
        "message_stop",
        "response.completed",
        "response.incomplete",
    )


@pytest.mark.parametrize("path", list(ROUTES))
def test_a_burst_at_three_times_capacity_gets_429_before_any_byte_or_runs_to_completion(path: str) -> None:
    # Item 6: two admission owners answered 200 and then an in-band "waiting queue is full".
    capacity = 6
    engine, _ = fake_engine([f"t{i} " for i in range(4)], step_s=0.005, max_running=2, capacity=capacity)
    body, anthropic = ROUTES[path]

    async def go() -> list[tuple[Reply, bool]]:
        app = await serving(engine)
        modes = [i % 2 == 0 for i in range(3 * capacity)]
        replies = await asyncio.gather(*[post(app, path, {**body, "stream": s}) for s in modes])
        return list(zip(replies, modes))

    results = run(go())
    refused = [r for r, _ in results if r.status == 429]
    assert refused and len(refused) <= 3 * capacity - capacity
    for reply, stream in results:
        if reply.status == 429:
            assert reply.headers["retry-after"] == "1" and reply.headers["content-type"] == "application/json"
            assert "capacity" in error_of(reply, anthropic)["message"]
        else:
            assert reply.status == 200 and is_complete(reply, stream, anthropic), reply.body[-300:]
    assert engine.gate.inflight == 0


def test_templating_and_tokenizing_run_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    # Item 4: a 10 MB prompt froze every route, /health included, for 34 s.
    engine, _ = fake_engine(["a"], context=4096)
    threads: list[int] = []
    render = FakeTokenizer.apply_chat_template

    def recording(self: FakeTokenizer, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return render(self, *args, **kwargs)

    monkeypatch.setattr(FakeTokenizer, "apply_chat_template", recording)
    huge = {"messages": [{"role": "user", "content": "x" * 30_000_000}], "max_tokens": 8}

    async def go() -> tuple[Reply, list[float], int]:
        app = await serving(engine)
        refusal = asyncio.create_task(post(app, "/v1/chat/completions", huge, timeout_s=60))
        waits = []
        while not refusal.done():
            began = time.monotonic()
            assert (await call(app, "GET", "/health")).status == 200
            waits.append(time.monotonic() - began)
            await asyncio.sleep(0.005)
        return await refusal, waits, threading.get_ident()

    refusal, waits, loop_thread = run(go())
    assert refusal.status == 400 and refusal.json()["error"]["code"] == "context_length_exceeded"
    assert threads and loop_thread not in threads
    assert max(waits) < 1.0  # an upper bound that cannot flake; p99 is measured in bench/
