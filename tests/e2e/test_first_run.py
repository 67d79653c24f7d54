"""Tier 3: what a new user sees on a first start — one greeting after the port is bound, no
Hypercorn chatter, a readable device line — and a port clash said once, without the greeting."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.server_proc import ROOT, ServerProcess

pytestmark = pytest.mark.real


def test_start_log_greets_once_names_the_device_and_leaves_out_hypercorn(
    smollm_server: ServerProcess,
) -> None:
    log = smollm_server.log()
    assert log.count("mlx-serve: listening on") == 1
    assert "INFO hypercorn.error" not in log
    assert "device: CPU (" in log and "Device(" not in log


def test_a_taken_port_is_one_error_line_and_no_greeting(smollm_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "mlx_serve", "--model", str(smollm_path), "--port", str(port)],
            cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert out.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr
    assert "listening on" not in out.stderr


def test_help_names_the_commands_and_what_compatibility_flags_do() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "mlx_serve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    text = " ".join(out.stdout.split())
    assert "commands: mlx-serve serve|pull|ls|rm|ps|doctor|fit|bench|launch|service" in text
    assert "--use-default-chat-template accepted for mlx_lm.server compatibility, with no effect" in text
    assert "a path to a .jinja file" in text and "what the log shows (INFO)" in text
    assert "Default: off" not in text


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the process name is set with Linux's prctl")
def test_the_server_process_is_named_mlx_serve(smollm_server: ServerProcess) -> None:
    comm = Path(f"/proc/{smollm_server.proc.pid}/comm").read_text().strip()
    assert comm == "mlx-serve"  # `pgrep mlx-serve` finds it, though it was started as python -m mlx_serve


def test_both_command_names_are_installed() -> None:
    bin_dir = Path(sys.executable).parent
    for name in ("mlx-serve", "mlx-serving"):
        out = subprocess.run(
            [str(bin_dir / name), "--version"], capture_output=True, text=True, timeout=60, check=True
        )
        assert out.stdout.startswith("mlx-serve ")
