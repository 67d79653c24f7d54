"""`mlx-serve launch claude|codex [CLI args]`: run a real agent CLI against this server.

Finds a running server ($MLX_SERVE_URL or --url, default http://127.0.0.1:8080) or starts one
(`--model` picks its model; it stops again when the CLI exits unless --keep-server), asks it
for its model's name, then runs the CLI with that model for every role and the environment or
provider config that points it here — telemetry and non-essential traffic off — passing the
CLI's own arguments through and returning its exit status.

    mlx-serve launch claude                     # interactive Claude Code on the local model
    mlx-serve launch --model qwen2.5-coder-1.5b codex exec "fix the test"
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from mlx_serve.server.local import DEFAULT_URL, KEY_ENV, URL_ENV, auth_headers

AGENTS = {"claude": "claude", "codex": "codex"}
CLI_ENV = {"claude": "MLX_SERVE_CLAUDE", "codex": "MLX_SERVE_CODEX"}  # the CLI's path, if not on PATH
READY_TIMEOUT_S = 900.0
CLAUDE_QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


@dataclass(slots=True)
class Plan:
    agent: str
    url: str = field(default_factory=lambda: os.environ.get(URL_ENV, DEFAULT_URL).rstrip("/"))
    model: str | None = None  # the model a server started here serves
    cli: str | None = None
    keep_server: bool = False
    args: list[str] = field(default_factory=list)


USAGE = (
    "usage: mlx-serve launch [--url URL] [--model MODEL] [--cli PATH] [--keep-server] "
    "claude|codex [CLI args ...]"
)


def parse(argv: list[str]) -> Plan:
    """Our options, then the agent's name, then the CLI's own arguments untouched."""
    opts: dict[str, str] = {}
    keep = False
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        flag = argv[i]
        if flag == "--keep-server":
            keep, i = True, i + 1
            continue
        if flag not in ("--url", "--model", "--cli") or i + 1 >= len(argv):
            raise ValueError(f"{flag}: not an option of launch\n{USAGE}")
        opts[flag[2:]], i = argv[i + 1], i + 2
    if i >= len(argv) or argv[i] not in AGENTS:
        raise ValueError(f"name the agent: claude or codex\n{USAGE}")
    plan = Plan(argv[i], model=opts.get("model"), cli=opts.get("cli"), keep_server=keep, args=argv[i + 1 :])
    if "url" in opts:
        plan.url = opts["url"].rstrip("/")
    return plan


def launch(argv: list[str]) -> int:
    try:
        plan = parse(argv)
    except ValueError as exc:
        print(f"mlx-serve launch: {exc}", file=sys.stderr)
        return 2
    cli = find_cli(plan)
    if cli is None:
        name = AGENTS[plan.agent]
        print(
            f"mlx-serve launch: {name} is not on PATH; install it "
            f"({'npm i -g @anthropic-ai/claude-code' if name == 'claude' else 'npm i -g @openai/codex'}) "
            f"or name it with --cli PATH or ${CLI_ENV[plan.agent]}",
            file=sys.stderr,
        )
        return 1
    started = None if answers(plan.url) else start_server(plan)
    try:
        if not wait_ready(plan.url, started):
            return 1
        model = served_model(plan.url)
        cmd, env = agent_command(plan, cli, model)
        print(f"mlx-serve launch: {plan.agent} on {model} at {plan.url}", file=sys.stderr, flush=True)
        return subprocess.call(cmd, env=env)
    finally:
        if started is not None and not plan.keep_server:
            started.terminate()
            started.wait(timeout=60)


def find_cli(plan: Plan) -> str | None:
    return plan.cli or os.environ.get(CLI_ENV[plan.agent]) or shutil.which(AGENTS[plan.agent])


def answers(url: str) -> bool:
    """Whether a server answers there (ready or still loading)."""
    try:
        return httpx.get(f"{url}/health", timeout=3).status_code in (200, 503)
    except httpx.HTTPError:
        return False


def start_server(plan: Plan) -> subprocess.Popen[bytes]:
    """This server on the URL's host and port, its log in the model cache's folder."""
    from mlx_serve.engine.model.loader import cache_root

    parts = urlsplit(plan.url)
    args = [sys.executable, "-m", "mlx_serve", "--host", parts.hostname or "127.0.0.1"]
    args += ["--port", str(parts.port or 8080)]
    if plan.model:
        args += ["--model", plan.model]
    log = cache_root() / "launch-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"mlx-serve launch: starting a server at {plan.url} (log: {log})", file=sys.stderr, flush=True)
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(url: str, started: subprocess.Popen[bytes] | None) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=3).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if started is not None and started.poll() is not None:
            print("mlx-serve launch: the server exited; see its log", file=sys.stderr)
            return False
        time.sleep(0.5)
    print(f"mlx-serve launch: the server at {url} was not ready in {READY_TIMEOUT_S:.0f} s", file=sys.stderr)
    return False


def served_model(url: str) -> str:
    models = httpx.get(f"{url}/v1/models", headers=auth_headers(), timeout=10).json()
    return str(models["data"][0]["id"])


def agent_command(plan: Plan, cli: str, model: str) -> tuple[list[str], dict[str, str]]:
    key = os.environ.get(KEY_ENV) or "mlx-serve"  # the CLIs want one; a keyless server ignores it
    env = dict(os.environ)
    if plan.agent == "claude":
        env.update(CLAUDE_QUIET)
        env.update({"ANTHROPIC_BASE_URL": plan.url, "ANTHROPIC_API_KEY": key, "ANTHROPIC_MODEL": model})
        for role in ("ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL"):
            env[role] = model
        for role in (
            "ANTHROPIC_DEFAULT_HAIKU_MODEL",
            "ANTHROPIC_SMALL_FAST_MODEL",
            "CLAUDE_CODE_SUBAGENT_MODEL",
        ):
            env[role] = model
        return [cli, "--model", model, *plan.args], env
    env["MLX_SERVE_API_KEY"] = key
    return [cli, *codex_config(plan.url, model), *plan.args], env


def codex_config(url: str, model: str) -> list[str]:
    """Codex's provider for this server, as `-c key=value` overrides (the user's own
    ~/.codex/config.toml is left as it is)."""
    provider = "model_providers.mlx-serve"
    pairs = {
        "model": f'"{model}"',
        "model_provider": '"mlx-serve"',
        f"{provider}.name": '"mlx-serve"',
        f"{provider}.base_url": f'"{url}/v1"',
        f"{provider}.env_key": f'"{KEY_ENV}"',
        f"{provider}.wire_api": '"responses"',
        # Responses over WebSocket: one socket for the whole session, each turn continuing the
        # last on it (the server keeps the connection's responses for previous_response_id)
        f"{provider}.supports_websockets": "true",
        # a long agent prompt can take minutes to prefill on a small machine; comments do not count
        f"{provider}.stream_idle_timeout_ms": "1800000",
        "check_for_update_on_startup": "false",
        "analytics.enabled": "false",
        "feedback.enabled": "false",
        "otel.exporter": '"none"',
    }
    return [arg for k, v in pairs.items() for arg in ("-c", f"{k}={v}")]
