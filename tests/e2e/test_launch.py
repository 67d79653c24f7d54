"""Tier 3: `mlx-serve launch claude|codex` runs the real CLIs against us — Claude Code with a
server that launch starts (and stops) itself, Codex with one already running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mlx_serve.engine.model.loader import cache_root
from tests.e2e import clis
from tests.e2e.test_codex import lean
from tests.support.server_proc import ServerProcess, free_port

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        not (clis.installed("claude", clis.CLAUDE_CODE) and clis.installed("codex", clis.CODEX)),
        reason="the agent CLIs are not installed (scripts/test.sh)",
    ),
]


def run_launch(scratch: Path, *argv: str, timeout_s: float = 900) -> subprocess.CompletedProcess[str]:
    env = clis._isolated(
        scratch, {"MLX_SERVE_CACHE": str(cache_root()), "CODEX_HOME": str(scratch / "codex")}
    )
    (scratch / "codex").mkdir(exist_ok=True)
    for name in ("LD_PRELOAD", "MLX_SERVE_BLAS_CHOSEN"):
        if name in os.environ:
            env[name] = os.environ[name]
    cmd = [sys.executable, "-m", "mlx_serve", "launch", *argv]
    with open(os.devnull, "rb") as stdin:
        return subprocess.run(
            cmd,
            env=env,
            cwd=scratch / "work",
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )


def test_launch_claude_starts_a_server_runs_a_turn_and_stops_it(smollm_path: Path, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = run_launch(
        tmp_path, "--url", url, "--model", str(smollm_path), "--cli", str(clis.BIN / "claude"),
        "claude", "-p", "say hi", "--output-format", "stream-json", "--verbose", "--bare",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"starting a server at {url}" in out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    [result] = [e for e in events if e.get("type") == "result"]
    assert (result["subtype"], result["is_error"]) == ("success", False)
    [init] = [e for e in events if e.get("type") == "system" and e.get("subtype") == "init"]
    assert init["model"] == "SmolLM2-135M-Instruct" or init["model"] == str(smollm_path.resolve())
    with pytest.raises(httpx.HTTPError):  # the server it started is gone with the CLI
        httpx.get(f"{url}/health", timeout=2)


def test_launch_codex_finds_the_running_server(smollm_server: ServerProcess, tmp_path: Path) -> None:
    before = smollm_server.log().count("route=/v1/responses ")
    out = run_launch(
        tmp_path, "--url", smollm_server.url, "--cli", str(clis.BIN / "codex"),
        "codex", "exec", "--skip-git-repo-check", "--json", *lean(tmp_path), "say hi",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "starting a server" not in out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [e for e in events if e.get("type") == "turn.completed"]
    # It spoke to this server over one WebSocket (launch sets supports_websockets): its prewarm
    # and its turn, which continues the prewarm's response on the same connection.
    assert "Falling back from WebSockets" not in out.stdout
    lines = [ln for ln in smollm_server.log().splitlines() if "route=/v1/responses " in ln][before:]
    assert len(lines) >= 2 and all("method=WS " in ln and "status=200" in ln for ln in lines), lines
    assert len({ln.split(" client=")[1].split()[0] for ln in lines}) == 1  # one socket
