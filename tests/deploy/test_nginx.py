"""Tier 3: the shipped nginx site (deploy/nginx/mlx-serve.conf) in front of a real mlx-serve.

nginx is Debian's (nginx-light), installed here when missing; the test fails if it cannot be.
Clients speak HTTPS with HTTP/2 (and HTTP/1.1) to nginx; nginx speaks HTTP/1.1 to mlx-serve.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.deploy.tools import (
    Arrival,
    H2Client,
    Nginx,
    content_frames,
    tokens_settle,
    trusting,
    wait_for_stats,
)
from tests.support.server_proc import ServerProcess

STORY = [{"role": "user", "content": "Write a very long story about a dragon who learns to cook."}]
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def upstream(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    # One batch row and one waiting place: the third concurrent request is refused with 429.
    log = tmp_path_factory.mktemp("nginx-upstream") / "server.log"
    server = ServerProcess(
        ["--model", str(smollm_path), "--decode-concurrency", "1", "--max-queue", "1"], log
    )
    yield server
    server.close()


@pytest.fixture(scope="module")
def nginx(upstream: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nginx]:
    proxy = Nginx(upstream.port, tmp_path_factory.mktemp("nginx")).start()
    yield proxy
    proxy.stop()


def client(nginx: Nginx, *, http2: bool = True) -> httpx.Client:
    return httpx.Client(http2=http2, verify=trusting(nginx.cert), timeout=120)


def stream_arrivals(nginx: Nginx, max_tokens: int) -> tuple[list[Arrival], bytes]:
    """Stream a chat completion through nginx; stamp each (decoded) read as it arrives."""
    body = {"messages": STORY, "max_tokens": max_tokens, "stream": True}
    arrivals, raw = [], b""
    with client(nginx) as c:
        start = time.monotonic()
        with c.stream("POST", nginx.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200 and r.http_version == "HTTP/2"
            assert r.headers["content-type"].startswith("text/event-stream")
            for chunk in r.iter_bytes():
                arrivals.append(Arrival(time.monotonic() - start, content_frames(chunk)))
                raw += chunk
    return arrivals, raw


def one_by_one(arrivals: list[Arrival]) -> str:
    """'' when the content frames came as separate reads spread over the generation, else why not."""
    carrying = [a for a in arrivals if a.content_frames]
    total = sum(a.content_frames for a in carrying)
    if len(carrying) < total // 2 or max(a.content_frames for a in carrying) > max(3, total // 5):
        return f"{total} frames came in {len(carrying)} reads: {[a.content_frames for a in carrying]}"
    # Separate reads that all came together (a flushed buffer in many small records) are a burst too.
    gaps = sorted(b.at_s - a.at_s for a, b in itertools.pairwise(carrying))
    if gaps and gaps[len(gaps) // 2] < 0.001:
        return f"the reads came back to back: median gap {gaps[len(gaps) // 2] * 1000:.3f} ms"
    return ""


def test_nginx_streams_sse_frame_by_frame_over_http2(nginx: Nginx, upstream: ServerProcess) -> None:
    tokens_settle(upstream.url)
    arrivals, raw = stream_arrivals(nginx, max_tokens=30)
    assert raw.endswith(b"data: [DONE]\n\n")
    assert sum(a.content_frames for a in arrivals) >= 15, raw[-500:]
    assert one_by_one(arrivals) == ""


def test_nginx_frame_check_catches_a_buffering_proxy(upstream: ServerProcess, tmp_path: Path) -> None:
    # The control: buffering on (X-Accel-Buffering ignored) plus gzip holds the frames back,
    # and the check above sees it.
    def misconfigure(site: str) -> str:
        return site.replace(
            "proxy_buffering off;", "proxy_buffering on; proxy_ignore_headers X-Accel-Buffering;"
        ).replace("gzip off;", "gzip on; gzip_types text/event-stream; gzip_min_length 1;")

    buffering = Nginx(upstream.port, tmp_path, edit=misconfigure).start()
    try:
        tokens_settle(upstream.url)
        arrivals, raw = stream_arrivals(buffering, max_tokens=30)
    finally:
        buffering.stop()
    assert raw.endswith(b"data: [DONE]\n\n")
    assert one_by_one(arrivals) != ""


def test_nginx_http1_client_leaving_cancels_generation(nginx: Nginx, upstream: ServerProcess) -> None:
    tokens_settle(upstream.url)
    before = upstream.stats()
    body = {"messages": STORY, "max_tokens": 1000, "stream": True}
    with (
        client(nginx, http2=False) as c,
        c.stream("POST", nginx.url + "/v1/chat/completions", json=body) as r,
    ):
        seen = 0
        for chunk in r.iter_raw():
            seen += content_frames(chunk)
            if seen >= 3:
                break
    # Leaving the block before the end closed the HTTP/1.1 connection.
    assert_cancelled(upstream, before)


def test_nginx_http2_stream_reset_cancels_generation(nginx: Nginx, upstream: ServerProcess) -> None:
    tokens_settle(upstream.url)
    before = upstream.stats()
    h2 = H2Client(nginx.https_port, trusting(nginx.cert))
    h2.post(1, "/v1/chat/completions", {"messages": STORY, "max_tokens": 1000, "stream": True})
    h2.read_content_frames(1, at_least=3)
    h2.reset(1)  # RST_STREAM; the connection to nginx stays open
    assert_cancelled(upstream, before)
    h2.post(3, "/v1/chat/completions", {"messages": STORY, "max_tokens": 2})
    status, _ = h2.response(3)
    h2.close()
    assert status == 200


def assert_cancelled(upstream: ServerProcess, before: dict[str, Any]) -> None:
    after = wait_for_stats(upstream.url, lambda s: s["requests_aborted"] > int(before["requests_aborted"]))
    settled = tokens_settle(upstream.url)
    assert after["requests_finished"] == before["requests_finished"]
    assert settled - int(before["generated_tokens"]) < 300, "generation went on after the client left"


def test_nginx_keeps_400_body_intact(nginx: Nginx, upstream: ServerProcess) -> None:
    bad = orjson.dumps({"messages": "not a list", "max_tokens": 5})
    direct = httpx.post(upstream.url + "/v1/chat/completions", content=bad, headers=JSON)
    with client(nginx) as c:
        proxied = c.post(nginx.url + "/v1/chat/completions", content=bad, headers=JSON)
    assert direct.status_code == proxied.status_code == 400
    assert proxied.headers["content-type"] == "application/json"
    assert proxied.content == direct.content
    assert proxied.json()["error"]["type"] == "invalid_request_error"


def test_nginx_keeps_429_body_and_retry_after(nginx: Nginx, upstream: ServerProcess) -> None:
    tokens_settle(upstream.url)
    long = {"messages": STORY, "max_tokens": 1000, "stream": True}
    with client(nginx) as c, c.stream("POST", nginx.url + "/v1/chat/completions", json=long) as running:
        seen, chunks = 0, running.iter_raw()  # kept: a dropped iterator would close the stream
        for chunk in chunks:
            seen += content_frames(chunk)
            if seen >= 1:
                break
        # The second takes the one waiting place (its SSE headers come once it is queued) ...
        with c.stream("POST", nginx.url + "/v1/chat/completions", json=long) as waiting:
            assert waiting.status_code == 200
            # ... and the third is refused, through nginx as when asked directly.
            third = {"messages": STORY, "max_tokens": 5}
            refused = c.post(nginx.url + "/v1/chat/completions", json=third)
            direct = httpx.post(upstream.url + "/v1/chat/completions", json=third)
    assert refused.status_code == direct.status_code == 429
    assert refused.content == direct.content
    assert refused.headers["content-type"] == "application/json"
    assert refused.headers["retry-after"] == direct.headers["retry-after"]
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    tokens_settle(upstream.url)


def test_nginx_body_over_limit_gets_mlx_serves_413(nginx: Nginx, upstream: ServerProcess) -> None:
    # nginx lets a little more than --max-body-bytes (32M) through, so mlx-serve answers in JSON.
    body = b'{"prompt": "' + b"x" * (32 * 2**20) + b'"}'
    with client(nginx, http2=False) as c:
        r = c.post(nginx.url + "/v1/completions", content=body, headers=JSON)
    assert r.status_code == 413, r.text[:300]
    assert r.json()["error"]["message"].startswith("request body is over the 33554432-byte limit")
