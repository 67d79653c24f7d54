"""The real Claude Code and Codex CLIs, run non-interactively against a local mlx-serve.

They are installed by scripts/test.sh (`npm install --prefix .npm-tools`, the versions pinned
below) and run isolated: a clean environment (`env -i` style), a scratch HOME, CODEX_HOME,
TMPDIR and working directory, stdin from /dev/null, telemetry and every non-essential request
off, so nothing leaves loopback. README's client section shows the same commands.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.server_proc import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".npm-tools" / "node_modules" / ".bin"
CLAUDE_CODE = "2.1.332"
CODEX = "0.171.0"
MODEL = "local-model"  # the name the CLIs ask for: a --served-model-name alias
KEY = "dummy"

# Telemetry, error reports, auto-update and every other non-essential request off.
CLAUDE_QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_MAX_RETRIES": "1",  # a failure shows at once, not after ten backoffs
}
CODEX_CONFIG = """\
model = "{model}"
model_provider = "mlx"
check_for_update_on_startup = false

[model_providers.mlx]
name = "mlx-serve"
base_url = "{base_url}/v1"
env_key = "MLX_API_KEY"
wire_api = "responses"
stream_max_retries = 1
# Codex gives up on a stream after 5 minutes without an SSE event (comment heartbeats do not
# count); its default-settings prompt (~8.7k tokens) takes about that long to prefill on 2 cores.
stream_idle_timeout_ms = 1800000

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[features]
plugins = false
"""


def serve(model: str, log: Path, optional: bool = False) -> ServerProcess:
    """mlx-serve with `model` under the name the CLIs ask for. An `optional` model the server
    cannot have (it says so in one line and exits 1) skips the test instead of failing it."""
    try:
        return ServerProcess(["--model", model, "--served-model-name", MODEL], log, ready_timeout_s=900)
    except RuntimeError as exc:
        if not optional:
            raise
        pytest.skip(f"{model} is not available here: {str(exc).splitlines()[-1]}")


PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}


def installed(name: str, version: str) -> bool:
    """Whether `name` (claude, codex) is installed at the pinned version (read, not run)."""
    manifest = BIN.parent / PACKAGES[name] / "package.json"
    if not (BIN / name).exists() or not manifest.exists():
        return False
    return bool(json.loads(manifest.read_text()).get("version") == version)


@dataclass(frozen=True, slots=True)
class Run:
    """One CLI run: its exit status, stdout's JSON lines, stderr."""

    rc: int
    events: list[dict[str, Any]]
    stdout: str
    stderr: str
    timed_out: bool = False  # stopped at the time limit (rc is then -9): what it printed so far

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == kind]


def _isolated(scratch: Path, extra: dict[str, str]) -> dict[str, str]:
    home, tmp = scratch / "home", scratch / "tmp"
    for d in (home, tmp, scratch / "work"):
        d.mkdir(parents=True, exist_ok=True)
    return {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmp), "TERM": "dumb", **extra}


def _run(cmd: list[str], env: dict[str, str], cwd: Path, timeout_s: float, partial: bool = False) -> Run:
    """Run a CLI to its end; with `partial`, one still running at `timeout_s` is stopped and
    what it printed by then is the Run (else the time limit fails the test)."""
    with open(os.devnull, "rb") as stdin:
        try:
            out = subprocess.run(
                cmd,
                env=env,
                cwd=cwd,
                stdin=stdin,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            if not partial:
                raise
            text = [
                (b or b"").decode() if isinstance(b, bytes) else (b or "") for b in (exc.stdout, exc.stderr)
            ]
            return Run(-9, _events(text[0]), text[0], text[1], timed_out=True)
    return Run(out.returncode, _events(out.stdout), out.stdout, out.stderr)


def _events(stdout: str) -> list[dict[str, Any]]:
    events = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut off by the time limit
                continue
    return events


def claude(
    base_url: str,
    scratch: Path,
    prompt: str,
    *args: str,
    timeout_s: float = 600,
    env: dict[str, str] | None = None,
) -> Run:
    """`claude -p PROMPT --output-format stream-json --verbose --model local-model ARGS`."""
    tmp = str(scratch / "tmp")
    settings = {
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": KEY,
        "CLAUDE_CODE_TMPDIR": tmp,
        "XDG_RUNTIME_DIR": tmp,
        **CLAUDE_QUIET,
        **(env or {}),
    }
    cmd = [
        str(BIN / "claude"),
        "-p",
        prompt,
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        MODEL,
        *args,
    ]
    return _run(cmd, _isolated(scratch, settings), scratch / "work", timeout_s)


def codex(
    base_url: str, scratch: Path, prompt: str, *args: str, timeout_s: float = 600, partial: bool = False
) -> Run:
    """`codex exec --skip-git-repo-check --json ARGS PROMPT` with a Responses provider."""
    codex_home = scratch / "home" / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(model=MODEL, base_url=base_url))
    env = _isolated(scratch, {"CODEX_HOME": str(codex_home), "MLX_API_KEY": KEY})
    cmd = [str(BIN / "codex"), "exec", "--skip-git-repo-check", "--json", *args, prompt]
    return _run(cmd, env, scratch / "work", timeout_s, partial)
