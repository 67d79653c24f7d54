"""Real tier: SmolLM2 behind the real server, its engine process stopped with SIGSTOP mid-stream.

With --engine-stall-s 2 the stopped engine reads as not responding (/health 503 saying so), the
open stream ends with an error frame instead of pausing silently, and the engine is restarted:
/health is 200 again and a request is served.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx

from tests.support.server_proc import ServerProcess

CHAT = {"messages": [{"role": "user", "content": "Count to a thousand."}], "max_tokens": 4000, "stream": True}


def test_a_stopped_engine_reads_unhealthy_fails_its_stream_and_is_restarted(
    smollm_path: Path, tmp_path: Path
) -> None:
    server = ServerProcess(["--model", str(smollm_path), "--engine-stall-s", "2"], tmp_path / "server.log")
    try:
        pid = int(server.stats()["engine_pid"])  # type: ignore[call-overload]
        health: list[tuple[int, str]] = []
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=CHAT, timeout=60) as reply:
            lines = reply.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # it is streaming
            os.kill(pid, signal.SIGSTOP)
            try:
                rest = list(lines)  # ends: the watchdog fails the stream
                probe = httpx.get(server.url + "/health", timeout=10)
                health.append((probe.status_code, probe.text))
            finally:
                os.kill(pid, signal.SIGCONT)  # harmless once killed
        assert any('"error"' in line for line in rest), rest[-3:]
        status, body = health[0]
        assert status == 503 and ("not responding" in body or "died" in body), body
        deadline = time.monotonic() + 120
        while httpx.get(server.url + "/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the engine did not come back"
            time.sleep(0.5)
        assert int(server.stats()["engine_pid"]) != pid  # type: ignore[call-overload]
        done = httpx.post(
            server.url + "/v1/chat/completions",
            json={"messages": CHAT["messages"], "max_tokens": 4},
            timeout=60,
        )
        assert done.status_code == 200
    finally:
        server.close()
