"""Tier 2: connection floods under a real Hypercorn on loopback, with mlx-serve's listening
sockets and connection server (the fake engine behind them).

Connect-and-close: the server closes its side at once and the slots are free again (Hypercorn's
own connection server waited for its keep-alive timer, 75 s, with every API route 503 meanwhile).
Connect-and-say-nothing: closed after the first-request timeout. Past the cap, a probe is
answered even while silent connections hold every overflow slot.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from mlx_serve.server import connections, transport
from mlx_serve.server.app import App
from mlx_serve.server.config import Config
from tests.support.fake_engine import fake_engine
from tests.support.server_proc import free_port

CAP = 48
KEEP_ALIVE_S = 75.0  # the server's default


@contextmanager
def flood_server(cap: int = CAP) -> Iterator[tuple[str, connections.ConnectionGate]]:
    from hypercorn.config import Config as HypercornConfig

    engine, _ = fake_engine(["a", "b"])
    app = App(Config(), engine)
    hc = HypercornConfig()
    hc.bind = [f"127.0.0.1:{free_port()}"]
    hc.accesslog = hc.errorlog = None
    hc.graceful_timeout = 0.5
    hc.keep_alive_timeout = KEEP_ALIVE_S
    hc.backlog = 1024
    gate = connections.ConnectionGate(cap, app)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(connections.serve(app, hc, gate, stop.wait),), daemon=True
    )
    thread.start()
    url = f"http://{hc.bind[0]}"
    wait_for(lambda: _answers(url + "/health") == 200, 30)
    try:
        yield url, gate
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def _answers(url: str) -> int | None:
    try:
        return httpx.get(url, timeout=3).status_code
    except httpx.HTTPError:
        return None


def wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def connect(url: str, n: int) -> list[socket.socket]:
    host, port = url.removeprefix("http://").split(":")
    return [socket.create_connection((host, int(port)), timeout=10) for _ in range(n)]


def test_connect_and_close_flood_frees_every_slot_at_once() -> None:
    with flood_server() as (url, gate):
        flood = connect(url, 4 * CAP)
        wait_for(lambda: gate.open == CAP)
        assert _answers(url + "/v1/models") == 503  # at the cap: the flood holds every slot
        for s in flood:
            s.close()
        began = time.monotonic()
        wait_for(lambda: _answers(url + "/v1/models") == 200, 10)
        assert time.monotonic() - began < 5  # not the keep-alive timer's 75 s
        wait_for(lambda: gate.open <= 1)


def test_a_connection_that_never_sends_a_request_is_closed_at_the_first_request_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport.ServedConnection, "first_request_s", 1.0)
    with flood_server() as (url, gate):
        wait_for(lambda: gate.open == 0)  # the readiness probe's connection has closed
        silent = connect(url, CAP)
        wait_for(lambda: gate.open == CAP)
        began = time.monotonic()
        for s in silent:
            assert s.recv(1) == b""  # the server closed it
        assert time.monotonic() - began < 5
        wait_for(lambda: gate.open == 0)
        assert _answers(url + "/v1/models") == 200
        for s in silent:
            s.close()


def test_a_half_closed_connection_gets_its_answer_then_is_closed() -> None:
    with flood_server() as (url, gate):
        [s] = connect(url, 1)
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):  # ends only when the server closes its side
            answer += chunk
        s.close()
        assert answer.startswith(b"HTTP/1.1 200 ")
        wait_for(lambda: gate.open <= 1, 5)


def test_probes_are_answered_past_the_cap_while_silent_connections_hold_the_overflow_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connections, "OVERFLOW_HEAD_S", 30.0)  # the silent ones hold their slots throughout
    with flood_server() as (url, gate):
        wait_for(lambda: gate.open == 0)  # the readiness probe's connection has closed
        held = connect(url, CAP)
        wait_for(lambda: gate.open == CAP)
        silent = connect(url, 3 * connections.OVERFLOW_SLOTS)
        wait_for(lambda: gate.overflowing == connections.OVERFLOW_SLOTS)
        for path in ("/health", "/metrics", "/health"):
            reply = httpx.get(url + path, timeout=5)
            assert reply.status_code == 200, (path, reply.status_code)
        assert httpx.get(url + "/v1/models", timeout=5).status_code == 503  # an API route: still at the cap
        assert gate.evicted > 0
        for s in held + silent:
            s.close()
