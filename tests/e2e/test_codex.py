"""Tier 3: the real Codex CLI against a real mlx-serve, through a `wire_api = "responses"`
provider.

Codex 0.171's default first request is ~10,000 tokens (17 KB of base instructions, nine tools
with a namespace and web_search): too long for SmolLM2's 8,192-token context, so with default
settings it must get the context error it understands ("ran out of room"), proving every
field and tool it sends was accepted. Codex's own settings trim it (LEAN: its short-model
knobs, instructions from a file) so the turn completes. The tool turn needs a model that calls
tools: `--model qwen2.5-coder-0.5b` (MLX_SERVE_TOOL_MODEL overrides it), skipped when the
server cannot load it. Default settings there: ~10,000 tokens of prefill, about three minutes
on a 2-core CPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import clis
from tests.support.server_proc import ServerProcess, access_count

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        not clis.installed("codex", clis.CODEX), reason="Codex not installed (scripts/test.sh)"
    ),
]
TOOL_MODEL = os.environ.get("MLX_SERVE_TOOL_MODEL", "qwen2.5-coder-0.5b")
MARKER = "mlx-serve-ok"
INSTRUCTIONS = "You are a coding agent in a terminal. Use your tools when asked to; answer briefly.\n"


def lean(scratch: Path) -> list[str]:
    """Codex's own settings for a small context: no sub-agents, goals or web search, and
    short base instructions (README shows the same flags)."""
    instructions = scratch / "instructions.md"
    instructions.parent.mkdir(parents=True, exist_ok=True)
    instructions.write_text(INSTRUCTIONS)
    return ["--disable", "multi_agent", "--disable", "goals", "-c", 'web_search="disabled"',
            "-c", f"model_instructions_file={instructions}"]  # fmt: skip


@pytest.fixture(scope="module")
def smollm(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = clis.serve(str(smollm_path), tmp_path_factory.mktemp("logs") / "codex-smollm.log")
    yield server
    server.close()


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = clis.serve(TOOL_MODEL, optional=True, log=tmp_path_factory.mktemp("logs") / "codex-tools.log")
    yield server
    server.close()


def responses_lines(server: ServerProcess, at_least: int, wait_s: float = 30) -> list[str]:
    """The access log's Responses lines, waiting a little for a request still ending."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = [ln for ln in server.log().splitlines() if "route=/v1/responses " in ln]
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.5)


def items(run: clis.Run, kind: str) -> list[dict[str, Any]]:
    return [e["item"] for e in run.of_type("item.completed") if e["item"]["type"] == kind]


def test_default_request_is_accepted_and_too_long_for_an_8k_model(
    smollm: ServerProcess, tmp_path: Path
) -> None:
    run = clis.codex(smollm.url, tmp_path, "say hi")
    [failed] = run.of_type("turn.failed")
    assert run.rc == 1 and "ran out of room in the model's context window" in failed["error"]["message"]
    lines = [ln for ln in smollm.log().splitlines() if "route=/v1/responses " in ln]
    assert lines and all("status=400" in ln and "error=context_too_long" in ln for ln in lines)


def test_lean_settings_complete_a_turn_on_smollm2(smollm: ServerProcess, tmp_path: Path) -> None:
    run = clis.codex(smollm.url, tmp_path, "say hi", *lean(tmp_path))
    assert run.rc == 0, run.stdout[-2000:] + run.stderr[-2000:]
    [message] = items(run, "agent_message")
    assert message["text"].strip()
    [done] = run.of_type("turn.completed")
    assert done["usage"]["input_tokens"] > 0 and done["usage"]["output_tokens"] > 0


@pytest.fixture(scope="module")
def short_steps(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """SmolLM2 prefilling 256 tokens a step: on a busy 2-core CPU one 2,048-token step can
    outlast the engine's 30 s watchdog, which then restarts it mid-turn."""
    log = tmp_path_factory.mktemp("logs") / "codex-ws.log"
    args = ["--model", str(smollm_path), "--served-model-name", clis.MODEL, "--prefill-step-size", "256"]
    server = ServerProcess(args, log, ready_timeout_s=900)
    yield server
    server.close()


@pytest.mark.timeout(1800)
def test_lean_settings_complete_a_turn_over_websocket(short_steps: ServerProcess, tmp_path: Path) -> None:
    """With `supports_websockets`, Codex opens /v1/responses as a WebSocket: its prewarm
    (generate: false) and then the turn, continuing the prewarm, all on the socket."""
    smollm = short_steps
    before = len(smollm.log().splitlines())
    socket = ("-c", "model_providers.mlx.supports_websockets=true")
    run = clis.codex(smollm.url, tmp_path, "say hi", *lean(tmp_path), *socket, timeout_s=1500)
    assert run.rc == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Falling back from WebSockets" not in run.stdout  # Codex says so when it gives up on one
    [message] = items(run, "agent_message")
    assert message["text"].strip()
    lines = [ln for ln in smollm.log().splitlines()[before:] if "route=/v1/responses " in ln]
    assert len(lines) >= 2 and all("method=WS " in ln and "status=200" in ln for ln in lines), lines
    assert any("completion_tokens=0 " in ln for ln in lines)  # the prewarm generated nothing
    assert "completion_tokens=0 " not in lines[-1]  # the turn answered


@pytest.mark.timeout(1800)
def test_calls_its_shell_tool_and_gets_the_result_back(tool_model: ServerProcess, tmp_path: Path) -> None:
    prompt = f"Run the shell command `echo {MARKER}` and tell me what it printed."
    # Bounded: after its first call the model may go on calling tools, turn after turn.
    run = clis.codex(tool_model.url, tmp_path, prompt, *lean(tmp_path), timeout_s=300, partial=True)
    # A line ends a request; one that the bound cut short (its client gone) is logged as it ends.
    lines = responses_lines(tool_model, at_least=2)
    assert lines and all("status=200" in ln for ln in lines[:-1]), (lines, run.stderr[-2000:])
    assert "finish=tool_calls" in lines[0]  # the model's first answer is a call
    if len(lines) >= 2:  # Codex sent the call's outcome back within the bound (the 0.5B is slow here)
        # The next request resends the conversation and starts from the first one's cache (all
        # of its prompt but a partial last block of 256 tokens).
        assert access_count(lines[1], "cached_tokens") >= access_count(lines[0], "prompt_tokens") - 256 > 0, (
            lines[:2]
        )
    commands = items(run, "command_execution")
    if commands:
        assert MARKER in commands[0]["command"] and MARKER in commands[0]["aggregated_output"]
        assert commands[0]["exit_code"] == 0
    else:
        # Seen with Qwen2.5-Coder-0.5B, greedy: its exec_command fills in every optional field,
        # `sandbox_permissions: "require_escalated"` included, which Codex's exec mode (approval
        # "never") rejects and says so to the model: the call reached Codex's tool router whole.
        assert "codex_core::tools::router" in run.stderr, run.stderr[-2000:]
    for turn in run.of_type("turn.completed"):  # a turn that ended (the 0.5B may go on calling tools)
        assert turn["usage"]["cached_input_tokens"] > 0, turn


@pytest.mark.timeout(3600)
def test_default_settings_complete_a_turn(tool_model: ServerProcess, tmp_path: Path) -> None:
    run = clis.codex(tool_model.url, tmp_path, "say hi", timeout_s=3000)
    # The turn completes; whether the 0.5B says hi or only tries its tools first is the model's.
    completed = run.of_type("turn.completed")
    assert len(completed) == 1, (run.rc, run.stdout[-3000:], run.stderr[-2000:])
    assert run.rc == 0 and completed[0]["usage"]["output_tokens"] > 0, run.stdout[-3000:]
    lines = [ln for ln in tool_model.log().splitlines() if "route=/v1/responses " in ln]
    assert lines and all("status=200" in ln for ln in lines)
