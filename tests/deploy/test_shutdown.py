"""Tier 3: SIGTERM on a real mlx-serve (what launchd and systemd send): it stops accepting, lets
open streams finish for up to --shutdown-timeout-s, ends the rest with an error frame and
[DONE], and exits 0."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.server_proc import ServerProcess

STORY = [{"role": "user", "content": "Write a very long story about a dragon who learns to cook."}]


def stream_in_thread(url: str, max_tokens: int) -> tuple[threading.Thread, list[str], threading.Event]:
    lines: list[str] = []
    started = threading.Event()

    def run() -> None:
        body = {"messages": STORY, "max_tokens": max_tokens, "stream": True}
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                lines.append(line)
                if '"content":"' in line and '"content":""' not in line:
                    started.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, lines, started


def data_of(lines: list[str]) -> list[str]:
    return [ln[6:] for ln in lines if ln.startswith("data: ")]


def sigterm_when_streaming(server: ServerProcess, max_tokens: int) -> tuple[list[str], float]:
    thread, lines, started = stream_in_thread(server.url, max_tokens)
    assert started.wait(120), f"stream never started:\n{server.log()}"
    signalled = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(httpx.ConnectError):  # no longer accepting
        httpx.get(server.url + "/health", timeout=2)
    thread.join(60)
    assert not thread.is_alive()
    return lines, time.monotonic() - signalled


def test_sigterm_lets_a_short_stream_finish_and_exits_0(smollm_path: Path, tmp_path: Path) -> None:
    server = ServerProcess(["--model", str(smollm_path), "--shutdown-timeout-s", "60"], tmp_path / "s.log")
    try:
        lines, _ = sigterm_when_streaming(server, max_tokens=40)
        data = data_of(lines)
        assert data[-1] == "[DONE]"
        assert orjson.loads(data[-2])["choices"][0]["finish_reason"] in ("stop", "length")
        assert not any('"error"' in d for d in data)
        assert server.proc.wait(30) == 0, server.log()
    finally:
        server.close()


def test_sigterm_ends_a_long_stream_with_an_error_frame_after_the_timeout(
    smollm_path: Path, tmp_path: Path
) -> None:
    server = ServerProcess(["--model", str(smollm_path), "--shutdown-timeout-s", "1"], tmp_path / "s.log")
    try:
        lines, took_s = sigterm_when_streaming(server, max_tokens=2000)
        data = data_of(lines)
        assert data[-1] == "[DONE]"
        err = orjson.loads(data[-2])["error"]
        assert "shutting down" in err["message"] and err["type"] == "server_error"
        assert 0.9 <= took_s < 15, took_s
        assert server.proc.wait(30) == 0, server.log()
        assert "ending 1 generation(s) still running" in server.log()
    finally:
        server.close()


def test_sigterm_exit_leaves_nothing_behind_for_a_restart(
    smollm_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What launchd's KeepAlive and systemd's Restart= do next: start again on the same port.
    server = ServerProcess(["--model", str(smollm_path)], tmp_path / "first.log")
    engine_pid = int(server.stats()["engine_pid"])  # type: ignore[call-overload]
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(30) == 0, server.log()
    server.close()
    assert not running(engine_pid), "the engine process outlived the server"
    monkeypatch.setattr("tests.support.server_proc.free_port", lambda: server.port)
    again = ServerProcess(["--model", str(smollm_path)], tmp_path / "second.log")
    try:
        assert again.port == server.port and httpx.get(again.url + "/health").status_code == 200
    finally:
        again.close()


def running(pid: int) -> bool:
    """Alive and not a zombie (nobody may reap orphans in a container)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"
