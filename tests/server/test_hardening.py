"""Tier 2: hostile values that once broke the server or made it lie, each now a clean answer.

The app with the fake engine (the real core and scheduler, a scripted runner), behind a real
Hypercorn on a free port where the bytes on the wire matter (header values), or driven by hand.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlx_serve.server.app import App
from mlx_serve.server.config import Config
from mlx_serve.server.writer import MAX_HEADER_VALUE, header_value
from tests.support.asgi import call
from tests.support.fake_engine import fake_engine
from tests.support.hypercorn_app import hypercorn_serving

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    engine, _ = fake_engine([f"t{i} " for i in range(8)])
    with hypercorn_serving(App(Config(served_model_name=["m"]), engine)) as url:
        yield url


def _hosted_tool(kind: str) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 4, "messages": USER, "tools": [{"type": kind, "name": "web_search"}]}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "kind", ["web_search_\x1b[31m\r\nx-injected: 1", "web_search_" + "é" * 20_000], ids=["control", "20k"]
)
def test_warning_header_with_client_text_is_escaped_ascii_and_short(
    served: str, kind: str, stream: bool
) -> None:
    body = {**_hosted_tool(kind), "stream": stream}
    reply = httpx.post(
        served + "/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"}, timeout=30
    )
    assert reply.status_code == 200, reply.text
    assert "x-injected" not in reply.headers
    [warning] = reply.headers.get_list("warning")
    assert warning.isascii() and warning.isprintable()
    assert len(warning) <= MAX_HEADER_VALUE
    assert "web_search_" in warning


def test_header_value_escapes_every_control_character_and_truncates() -> None:
    raw = "".join(chr(c) for c in range(0xA0)) + "\u2028\ud7ff"
    out = header_value(raw).decode("ascii")
    assert out.isprintable()
    assert "\\x1b" in out and "\\n" in out and "\\x7f" in out and "\\u2028" in out
    assert header_value("a" * 10_000) == b"a" * (MAX_HEADER_VALUE - 3) + b"..."


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_logit_bias_key_of_thousands_of_digits_is_a_400_naming_the_field(path: str) -> None:
    engine, _ = fake_engine(["a", "b"])
    field = {"messages": USER} if "chat" in path else {"prompt": "hi"}
    body = json.dumps({**field, "max_tokens": 2, "logit_bias": {"9" * 5000: 1}}).encode()

    async def go() -> Any:
        app = App(Config(), engine)
        engine.start()
        await engine.wait_ready()
        return await call(app, "POST", path, body)

    reply = asyncio.run(go())
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert error["param"].startswith("logit_bias.")
    assert len(error["message"]) < 200


def _raw_exchange(url: str, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send raw bytes; everything the server writes until it closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def test_transfer_encoding_with_content_length_is_a_400_and_the_connection_closes(served: str) -> None:
    body = json.dumps({"messages": USER, "max_tokens": 2}).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\ntransfer-encoding: chunked\r\n\r\n" % len(body)
    )
    # The socket read ends only because the server closes the connection.
    answer = _raw_exchange(served, head + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    status, _, rest = answer.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 400")
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "Content-Length"


def test_body_cut_short_by_the_client_is_a_400_saying_how_much_came() -> None:
    engine, _ = fake_engine(["a", "b"])
    replies: list[dict[str, Any]] = []
    parts = iter([{"type": "http.request", "body": b'{"messages": [', "more_body": True}])

    async def receive() -> dict[str, Any]:
        return next(parts, {"type": "http.disconnect"})

    async def send(message: dict[str, Any]) -> None:
        replies.append(message)

    async def go() -> None:
        app = App(Config(), engine)
        engine.start()
        await engine.wait_ready()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"100")]
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
        await asyncio.wait_for(app(scope, receive, send), 10)

    asyncio.run(go())
    assert replies[0]["status"] == 400
    error = json.loads(replies[1]["body"])["error"]
    assert error["type"] == "invalid_request_error"
    assert "14 bytes of the 100" in error["message"]


TRACE_UNDER_A_SIZE_LIMIT = """
import logging, resource, signal, sys, time
from mlx_serve.server.observe import RequestRecord, TraceWriter
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit write() fails (EFBIG), as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
logging.basicConfig(level=logging.WARNING, format="LOG %(message)s")
trace = TraceWriter(sys.argv[1])
for i in range(200):
    record = RequestRecord("POST", "/v1/chat/completions", "127.0.0.1")
    record.id, record.ended = f"req-{i}", time.perf_counter()
    trace.write(record, record.summary())
trace.close()
print("dropped", trace.dropped)
"""


def test_trace_on_a_full_disk_drops_whole_lines_and_says_so_once(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    out = subprocess.run(
        [sys.executable, "-c", TRACE_UNDER_A_SIZE_LIMIT, str(path), "5000"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).parents[2],
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    lines = path.read_bytes().splitlines()
    assert 0 < len(lines) < 200
    assert [json.loads(line)["id"] for line in lines] == [f"req-{i}" for i in range(len(lines))]
    assert out.stdout.split() == ["dropped", str(200 - len(lines))]
    logged = [line for line in out.stderr.splitlines() if line.startswith("LOG ")]
    assert len(logged) == 1 and "lines dropped" in logged[0]


def test_client_text_in_a_refusal_reaches_the_access_log_escaped_and_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from mlx_serve.server.metrics import Metrics
    from mlx_serve.server.observe import RequestObserver

    engine, _ = fake_engine(["a", "b"])
    key = "\x1b[31m\r\nforged=1" + "7" * 5000
    body = json.dumps({"messages": USER, "max_tokens": 2, "logit_bias": {key: 1}}).encode()

    async def go() -> Any:
        app = App(Config(), engine)
        engine.start()
        await engine.wait_ready()
        return await call(RequestObserver(app, Metrics()), "POST", "/v1/chat/completions", body)

    with caplog.at_level(logging.INFO, logger="mlx_serve.access"):
        assert asyncio.run(go()).status == 400
    [line] = [r.getMessage() for r in caplog.records if r.name == "mlx_serve.access"]
    assert "param=logit_bias." in line and line.isprintable() and len(line) < 600
