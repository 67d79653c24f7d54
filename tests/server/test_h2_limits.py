"""Tier 2: abusive HTTP/2 (h2c, prior knowledge) on loopback against a real Hypercorn with
mlx-serve's connection server (the fake engine behind it), written frame by frame.

An oversized frame is refused from its header (GOAWAY FRAME_SIZE_ERROR) without its body being
read or held; a flood of PINGs ends in GOAWAY ENHANCE_YOUR_CALM; the server serves on after both.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mlx_serve.server.transport import CONTROL_FRAME_BURST
from tests.server.test_connection_floods import flood_server

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x4, 0x6, 0x7
FRAME_SIZE_ERROR, ENHANCE_YOUR_CALM = 0x6, 0xB
RSS_TOLERANCE = 4 * 1024 * 1024  # bytes the process may keep after a 16 MiB frame was refused


def frame(
    kind: int, payload: bytes = b"", flags: int = 0, stream: int = 0, length: int | None = None
) -> bytes:
    size = len(payload) if length is None else length
    return struct.pack(">I", size)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


@pytest.fixture
def served() -> Iterator[str]:
    with flood_server() as (url, _gate):
        yield url


def h2_connection(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(PREFACE + frame(SETTINGS))
    return s


def goaway_code(s: socket.socket) -> int | None:
    """The error code of the first GOAWAY the server sends, reading frames until it closes."""
    data = b""
    while True:
        while len(data) >= 9:
            length = int.from_bytes(data[:3], "big")
            if len(data) < 9 + length:
                break
            kind, body, data = data[3], data[9 : 9 + length], data[9 + length :]
            if kind == GOAWAY:
                return int.from_bytes(body[4:8], "big")
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def send_quietly(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
    except OSError:
        pass  # the server closed the connection part way: what the test expects


def test_oversized_frame_is_a_frame_size_error_from_its_header_and_its_body_is_not_kept(served: str) -> None:
    before = rss()
    s = h2_connection(served)
    header = frame(DATA, stream=1, length=2**24 - 1)
    sender = threading.Thread(target=send_quietly, args=(s, header + bytes(2**24 - 1)))
    sender.start()
    assert goaway_code(s) == FRAME_SIZE_ERROR
    sender.join(30)
    s.close()
    assert httpx.get(served + "/health", timeout=5).status_code == 200
    assert rss() - before < RSS_TOLERANCE


def test_ping_flood_ends_in_enhance_your_calm_and_the_server_serves_on(served: str) -> None:
    s = h2_connection(served)
    pings = b"".join(frame(PING, struct.pack(">Q", i)) for i in range(int(CONTROL_FRAME_BURST) * 20))
    sender = threading.Thread(target=send_quietly, args=(s, pings))
    sender.start()
    assert goaway_code(s) == ENHANCE_YOUR_CALM
    sender.join(30)
    s.close()
    assert httpx.get(served + "/health", timeout=5).status_code == 200


def test_a_well_behaved_h2_client_is_served(served: str) -> None:
    with httpx.Client(http1=False, http2=True) as client:
        for _ in range(3):
            assert client.get(served + "/health", timeout=5).status_code == 200
