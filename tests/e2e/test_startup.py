"""Tier 3: what an operator sees when the server cannot start (one clear line, exit 1)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.support.server_proc import ROOT, free_port


def run_server(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "server", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_a_missing_model_folder_is_one_line_and_exit_1(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    done = run_server("--model", str(missing), "--port", str(free_port()))
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert errors and "cannot load the model" in errors[0] and str(missing) in done.stderr
    assert "Traceback" not in done.stderr


def test_a_port_in_use_is_one_line_and_exit_1(smollm_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_server("--model", str(smollm_path), "--port", str(port))
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr


def test_version_flag() -> None:
    done = run_server("--version", timeout_s=30)
    assert done.returncode == 0 and done.stdout.startswith("mlx-serve ")
