"""Tier 1: the launchd plist and systemd unit, shipped and printed by `mlx-serve service`."""

from __future__ import annotations

import plistlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mlx_serve.server.service import systemd_quote
from tests.support.server_proc import ROOT

PLIST = ROOT / "deploy" / "launchd" / "local.mlx-serve.plist"
UNIT = ROOT / "deploy" / "systemd" / "mlx-serve.service"
SERVICE = [sys.executable, "-m", "mlx_serve", "service"]


def service(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*SERVICE, *args], cwd=ROOT, capture_output=True, timeout=120, check=False)


def printed_plist(*args: str) -> dict[str, Any]:
    r = service("print-plist", *args)
    assert r.returncode == 0, r.stderr.decode()
    plist: dict[str, Any] = plistlib.loads(r.stdout)
    return plist


def check_launchd_keys(plist: dict[str, object]) -> None:
    assert plist["KeepAlive"] is True and plist["RunAtLoad"] is True
    assert isinstance(plist["ThrottleInterval"], int) and plist["ThrottleInterval"] >= 10
    assert str(plist["StandardOutPath"]).endswith(".log") and str(plist["StandardErrorPath"]).endswith(".log")
    assert Path(str(plist["WorkingDirectory"])).is_absolute()
    env = plist["EnvironmentVariables"]
    assert isinstance(env, dict) and env["PYTHONUNBUFFERED"] == "1" and "PATH" in env and "HOME" in env


def test_shipped_plist_parses_and_has_the_service_keys() -> None:
    plist = plistlib.loads(PLIST.read_bytes())
    check_launchd_keys(plist)
    args = plist["ProgramArguments"]
    assert isinstance(args, list) and args[0].endswith("/mlx-serve")
    assert plist["ExitTimeOut"] > float(args[args.index("--shutdown-timeout-s") + 1])


def test_printed_plist_starts_this_server_with_the_flags(tmp_path: Path) -> None:
    plist = printed_plist(
        "--working-directory",
        str(tmp_path),
        "--env",
        "HF_HOME=/srv/hf",
        "--model",
        "some/model",
        "--port",
        "9001",
        "--shutdown-timeout-s",
        "20",
    )
    check_launchd_keys(plist)
    assert set(plist) == set(plistlib.loads(PLIST.read_bytes()))  # the template shows every key
    args = plist["ProgramArguments"]
    assert isinstance(args, list) and args[-6:] == [
        "--model",
        "some/model",
        "--port",
        "9001",
        "--shutdown-timeout-s",
        "20",
    ]
    assert plist["ExitTimeOut"] > 20 and plist["WorkingDirectory"] == str(tmp_path)
    assert plist["EnvironmentVariables"]["HF_HOME"] == "/srv/hf"
    # The command it names is this mlx-serve and starts: ask it for --help.
    r = subprocess.run([*args[:-6], "--help"], capture_output=True, timeout=120, cwd=tmp_path, check=False)
    assert r.returncode == 0 and b"mlx-serve" in r.stdout and b"--shutdown-timeout-s" in r.stdout


def test_printed_plist_as_daemon_names_the_user() -> None:
    plist = printed_plist("--daemon", "--user", "root", "--label", "com.example.llm", "--", "--port", "9002")
    assert plist["UserName"] == "root" and plist["Label"] == "com.example.llm"
    assert str(plist["StandardErrorPath"]).startswith("/Library/Logs/")


def test_print_plist_refuses_a_bad_server_flag() -> None:
    r = service("print-plist", "--no-such-flag")
    assert r.returncode == 2 and b"unrecognized arguments: --no-such-flag" in r.stderr
    r = service("print-plist", "--port", "99999")
    assert r.returncode == 2 and b"out of range" in r.stderr


def test_print_plist_warns_about_a_key_on_the_command_line() -> None:
    r = service("print-plist", "--api-key", "sk-1")
    assert r.returncode == 0 and b"prefer --api-key-file" in r.stderr


def test_systemd_quote() -> None:
    assert systemd_quote("/opt/m") == "/opt/m"
    assert systemd_quote("/m dir/x") == '"/m dir/x"'
    assert systemd_quote('a"b') == '"a\\"b"'
    assert systemd_quote("50%") == "50%%" and systemd_quote("$HOME") == "$$HOME"


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze is not installed (Debian package: systemd)")
    return found


def verify(unit: Path) -> None:
    r = subprocess.run(
        [systemd_analyze(), "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    own = [ln for ln in (r.stdout + r.stderr).splitlines() if unit.name in ln]
    assert r.returncode == 0 and not own, r.stdout + r.stderr


def test_printed_systemd_unit_verifies(tmp_path: Path) -> None:
    r = service(
        "print-systemd",
        "--user",
        "root",
        "--working-directory",
        str(tmp_path),
        "--",
        "--model",
        "/models/my model",
        "--port",
        "9003",
    )
    assert r.returncode == 0, r.stderr.decode()
    text = r.stdout.decode()
    assert '"/models/my model"' in text and "KillMode=mixed" in text and "Restart=always" in text
    unit = tmp_path / "mlx-serve.service"
    unit.write_text(text)
    verify(unit)


def test_shipped_systemd_unit_verifies_with_a_real_executable(tmp_path: Path) -> None:
    program = Path(sys.executable).parent / "mlx-serve"
    text = UNIT.read_text()
    assert text.count("/opt/mlx-serve/.venv/bin/mlx-serve") == 1
    unit = tmp_path / "mlx-serve.service"
    unit.write_text(text.replace("/opt/mlx-serve/.venv/bin/mlx-serve", str(program)))
    verify(unit)


def test_example_settings_file_loads() -> None:
    from mlx_serve.server.config import load_config

    cfg = load_config(["--config", str(ROOT / "deploy" / "mlx-serve.toml")])
    assert cfg.max_body_bytes == 32 * 2**20 and cfg.shutdown_timeout_s == 30 and cfg.host == "127.0.0.1"
    assert cfg.api_key_file and not cfg.protect_health
