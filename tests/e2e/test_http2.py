"""Tier 3: HTTP/2 against a real mlx-serve: h2c with prior knowledge on the plain port (curl),
TLS with ALPN h2 (httpx), concurrent streams on one connection, and RST_STREAM cancelling."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.deploy.tools import (
    H2Client,
    content_frames,
    ensure_tool,
    self_signed_cert,
    tokens_settle,
    trusting,
    wait_for_stats,
)
from tests.support.server_proc import ServerProcess

STORY = [{"role": "user", "content": "Write a very long story about a dragon who learns to cook."}]


class TlsServerProcess(ServerProcess):
    """ServerProcess on HTTPS: polls /health through TLS, trusting `cert`."""

    def __init__(self, args: list[str], log_path: Path, cert: Path, key: Path) -> None:
        self.cert = cert
        super().__init__([*args, "--certfile", str(cert), "--keyfile", str(key)], log_path)

    def _wait_ready(self, timeout_s: float) -> None:
        self.url = self.url.replace("http://", "https://")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", verify=trusting(self.cert), timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"server not ready in {timeout_s}s:\n{self.log()}")

    def stats(self) -> dict[str, object]:
        return dict(httpx.get(self.url + "/stats", verify=trusting(self.cert), timeout=5).json())


@pytest.fixture(scope="module")
def plain(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = ServerProcess(["--model", str(smollm_path)], tmp_path_factory.mktemp("h2c") / "server.log")
    yield server
    server.close()


@pytest.fixture(scope="module")
def tls(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServerProcess]:
    folder = tmp_path_factory.mktemp("h2-tls")
    cert, key = self_signed_cert(folder)
    server = TlsServerProcess(["--model", str(smollm_path)], folder / "server.log", cert, key)
    yield server
    server.close()


def test_h2c_prior_knowledge_streams_sse_with_curl(plain: ServerProcess, tmp_path: Path) -> None:
    curl = ensure_tool("curl", ("curl",))
    headers = tmp_path / "headers.txt"
    body = orjson.dumps({"messages": STORY, "max_tokens": 20, "stream": True})
    r = subprocess.run(
        [
            curl,
            "-sS",
            "-N",
            "--http2-prior-knowledge",
            "-D",
            str(headers),
            "-w",
            "\n%{http_version}",
            "-H",
            "content-type: application/json",
            "--data-binary",
            body,
            plain.url + "/v1/chat/completions",
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert out.endswith("\n2"), out[-200:]  # curl's %{http_version}
    assert headers.read_text().startswith("HTTP/2 200")
    assert "content-type: text/event-stream" in headers.read_text().lower()
    assert content_frames(r.stdout) >= 5 and "data: [DONE]\n\n" in out


def test_tls_alpn_h2_streams_sse_with_httpx(tls: TlsServerProcess) -> None:
    body = {"messages": STORY, "max_tokens": 20, "stream": True}
    with httpx.Client(http2=True, verify=trusting(tls.cert), timeout=120) as c:
        with c.stream("POST", tls.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200 and r.http_version == "HTTP/2"
            lines = list(r.iter_lines())
        models = c.get(tls.url + "/v1/models")
    data = [ln[6:] for ln in lines if ln.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert orjson.loads(data[-2])["choices"][0]["finish_reason"] in ("stop", "length")
    assert models.http_version == "HTTP/2" and models.json()["object"] == "list"


def test_tls_several_concurrent_streams_share_one_connection(tls: TlsServerProcess) -> None:
    async def one(c: httpx.AsyncClient, i: int) -> tuple[object, float, float, str]:
        body = {
            "messages": [{"role": "user", "content": f"Tell me fact number {i} about the sea."}],
            "max_tokens": 24,
            "stream": True,
        }
        first = last = 0.0
        async with c.stream("POST", tls.url + "/v1/chat/completions", json=body) as r:
            assert r.http_version == "HTTP/2"
            network = r.extensions["network_stream"]
            async for chunk in r.aiter_raw():
                if content_frames(chunk):
                    first = first or time.monotonic()
                    last = time.monotonic()
            tail = chunk.decode()
        return network, first, last, tail

    async def go() -> list[tuple[object, float, float, str]]:
        async with httpx.AsyncClient(http2=True, verify=trusting(tls.cert), timeout=120) as c:
            await c.get(tls.url + "/health")  # open the one connection first
            return await asyncio.gather(*(one(c, i) for i in range(4)))

    results = asyncio.run(go())
    assert len({id(net) for net, *_ in results}) == 1, "the streams did not share one connection"
    assert all(tail.endswith("data: [DONE]\n\n") for *_, tail in results)
    # Concurrent, not one after another: every stream had begun before any had ended.
    assert max(first for _, first, _, _ in results) < min(last for _, _, last, _ in results)


def test_h2_stream_reset_cancels_generation_and_keeps_the_connection(plain: ServerProcess) -> None:
    tokens_settle(plain.url)
    before: dict[str, Any] = plain.stats()
    client = H2Client(plain.port)
    client.post(1, "/v1/chat/completions", {"messages": STORY, "max_tokens": 1000, "stream": True})
    client.read_content_frames(1, at_least=3)
    client.reset(1)
    after = wait_for_stats(plain.url, lambda s: s["requests_aborted"] > int(before["requests_aborted"]))
    settled = tokens_settle(plain.url)
    assert after["requests_finished"] == before["requests_finished"]
    assert settled - int(before["generated_tokens"]) < 300, "generation went on after RST_STREAM"
    # Only the stream was reset: the same connection serves the next request.
    client.post(3, "/v1/chat/completions", {"messages": STORY, "max_tokens": 3})
    status, body = client.response(3)
    client.close()
    assert status == 200 and orjson.loads(body)["choices"][0]["message"]["content"]
