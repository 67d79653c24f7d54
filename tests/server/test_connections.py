"""Tier 2: connection limits under a real Hypercorn, on loopback (issue 15, item 5).

The app with the fake engine behind mlx-serve's capped listening sockets, --max-connections
small. Connections holding unfinished chunked bodies fill the cap: a new one gets a clean 503
(or its /health answer), never a reset; the holders get 408 once the body timeout passes; the
cause is logged once, without a traceback; service resumes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from mlx_serve.server import connections
from mlx_serve.server.app import App
from mlx_serve.server.config import Config
from tests.support.fake_engine import fake_engine
from tests.support.server_proc import free_port

CAP = 8
BODY_TIMEOUT_S = 1.5
CHAT = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'


@contextmanager
def capped_server(cap: int = CAP) -> Iterator[tuple[str, connections.ConnectionGate]]:
    from hypercorn.config import Config as HypercornConfig

    engine, _ = fake_engine(["a", "b"])
    app = App(Config(body_timeout_s=BODY_TIMEOUT_S), engine)
    hc = HypercornConfig()
    hc.bind = [f"127.0.0.1:{free_port()}"]
    hc.accesslog = hc.errorlog = None
    hc.graceful_timeout = 0.5
    gate = connections.ConnectionGate(cap, app)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(connections.serve(app, hc, gate, stop.wait),), daemon=True
    )
    thread.start()
    url = f"http://{hc.bind[0]}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, "server not ready"
        time.sleep(0.05)
    try:
        yield url, gate
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


def open_holding(url: str) -> socket.socket:
    """A connection that sends a POST head and one chunk of a chunked body, then nothing."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"mes\r\n'
    )
    return s


def raw_request(url: str, head: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


def wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_past_the_cap_new_connections_get_a_clean_503_and_health_keeps_answering(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    with capped_server() as (url, gate):
        wait_for(lambda: gate.open == 0)  # the readiness probe's connection has closed
        holders = [open_holding(url) for _ in range(CAP)]
        wait_for(lambda: gate.open == CAP)
        began = time.monotonic()
        refused = [
            raw_request(
                url,
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: "
                + str(len(CHAT)).encode()
                + b"\r\n\r\n"
                + CHAT,
            )
            for _ in range(20)
        ]
        health = raw_request(url, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head = raw_request(url, b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answered_in = time.monotonic() - began
        for reply in refused:
            assert reply.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in reply.lower()
            assert (
                b"connection: close" in reply.lower() and b'"error"' in reply and b"connection limit" in reply
            )
        assert health.startswith(b"HTTP/1.1 200 ") and health.endswith(b'{"status":"ok"}')
        assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")
        assert answered_in < 10 and gate.refused == 22 and gate.open == CAP
        # The holders' bodies never finish: each gets 408 once --body-timeout-s has passed.
        for s in holders:
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            assert data.startswith(b"HTTP/1.1 408 "), data[:200]
            s.close()
        wait_for(lambda: gate.open == 0)
        assert httpx.post(url + "/v1/chat/completions", content=CHAT, timeout=10).status_code == 200
    lines = [r for r in caplog.records if r.name == "mlx_serve.connections"]
    assert len(lines) == 1 and "connection limit" in lines[0].getMessage() and lines[0].exc_info is None
    assert not [r for r in caplog.records if r.exc_info and r.levelno >= logging.ERROR]


def test_a_trickled_body_is_cut_off_at_the_body_timeout() -> None:
    # One byte every 0.3 s kept a connection for ever (no body-read deadline).
    with capped_server() as (url, _gate):
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
            began, reply = time.monotonic(), b""
            s.settimeout(0.3)
            while not reply and time.monotonic() - began < 10:
                try:
                    s.sendall(b" ")
                    reply = s.recv(65536)
                except TimeoutError:
                    continue
            assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
            assert BODY_TIMEOUT_S <= time.monotonic() - began < BODY_TIMEOUT_S + 5


def test_the_cap_follows_the_open_file_limit() -> None:
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert connections.connection_cap(16) == 16
    assert connections.connection_cap(10**9) <= max(soft, 10**9)  # lowered, never raised past the limit
