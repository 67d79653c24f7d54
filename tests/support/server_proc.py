"""A real mlx-serve (Hypercorn) in a subprocess on a free port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


TEST_NAMES = ("m", "claude-x", "client-name")


def wait_healthy(url: str, exited: Callable[[], bool], timeout_s: float) -> str | None:
    """Poll `url`/health until it answers 200 (None); else why not: "exited" or "timeout"."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if exited():
            return "exited"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return None
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return "timeout"


class ServerProcess:
    """Starts `python -m mlx_serve ARGS`, waits for /health 200, and stops it on close()."""

    def __init__(
        self,
        args: list[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        ready_timeout_s: float = 300.0,
        bare: bool = False,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        # The names the tests' clients send, as aliases a user would give (README: model names).
        # `bare=True` starts it exactly as given (no aliases), as a user's plain `mlx-serve` would be.
        given = bare or "--served-model-name" in args
        aliases = [] if given else [a for n in TEST_NAMES for a in ("--served-model-name", n)]
        cmd = [sys.executable, "-m", "mlx_serve", "--port", str(self.port), *aliases, *args]
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        self._wait_ready(ready_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        why = wait_healthy(self.url, lambda: self.proc.poll() is not None, timeout_s)
        if why == "exited":
            raise RuntimeError(f"server exited {self.proc.returncode}:\n{self.log()}")
        if why is not None:
            self.close()
            raise RuntimeError(f"server not ready in {timeout_s}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stats(self) -> dict[str, object]:
        return dict(httpx.get(self.url + "/stats", timeout=5).json())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


def access_count(line: str, field: str) -> int:
    """A count from one line of the server's access log (`cached_tokens=N`, `prompt_tokens=N`)."""
    return int(line.split(f" {field}=")[1].split()[0])


def assert_disconnect_stops_generation(
    server: ServerProcess, path: str, body: dict[str, object], lines_before_leaving: int
) -> None:
    """Leave a 2000-token stream after a few lines: the engine must stop within a step or so."""
    before = server.stats()
    with httpx.stream("POST", server.url + path, json=body, timeout=60) as r:
        assert r.status_code == 200
        for n, _ in enumerate(r.iter_lines()):
            if n >= lines_before_leaving:
                break
    deadline = time.monotonic() + 10
    while server.stats()["requests_aborted"] == before["requests_aborted"]:
        assert time.monotonic() < deadline, "engine never saw the disconnect"
        time.sleep(0.05)
    settled = server.stats()["generated_tokens"]
    time.sleep(0.5)
    assert server.stats()["generated_tokens"] == settled
    assert int(str(settled)) - int(str(before["generated_tokens"])) < 200  # far from the 2000 asked for
