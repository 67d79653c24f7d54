"""Tier 3: the engine process dies mid-batch; the server says so, restarts it, and serves again."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from tests.support.server_proc import ServerProcess

STORY = [{"role": "user", "content": "Write a very long story about a dragon who learns to cook."}]


@pytest.fixture()
def server(smollm_path: Path, tmp_path: Path) -> ServerProcess:
    s = ServerProcess(["--model", str(smollm_path)], tmp_path / "server.log")
    yield s
    s.close()


def _stream_lines(url: str, out: list[str], started: threading.Event) -> None:
    body = {"messages": STORY, "max_tokens": 400, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            out.append(line)
            if line.startswith("data: {") and '"content":"' in line:
                started.set()


def test_engine_death_fails_inflight_then_recovers(server: ServerProcess) -> None:
    lines: list[list[str]] = [[], []]
    started = [threading.Event(), threading.Event()]
    threads = [
        threading.Thread(target=_stream_lines, args=(server.url, lines[i], started[i])) for i in (0, 1)
    ]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(120), "streams never started"
    pid = int(server.stats()["engine_pid"])
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(60)
    for got in lines:
        data = [ln[6:] for ln in got if ln.startswith("data: ")]
        assert data[-1] == "[DONE]"
        err = orjson.loads(data[-2])["error"]
        assert err["type"] == "server_error" and "engine process died" in err["message"]
    assert httpx.get(server.url + "/health").status_code == 503
    deadline = time.monotonic() + 180
    while httpx.get(server.url + "/health").status_code != 200:
        assert time.monotonic() < deadline, "engine never came back"
        time.sleep(0.2)
    stats = server.stats()
    assert stats["restarts"] == 1 and stats["engine_pid"] != pid
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=5)
    assert r.choices[0].message.content
