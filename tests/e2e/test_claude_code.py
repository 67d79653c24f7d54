"""Tier 3: the real Claude Code CLI against a real mlx-serve.

Claude Code 2.1's default first request is ~12,400 tokens (its system prompt, 12 tools, the
environment), which SmolLM2's 8,192-token context cannot hold: with default settings it must
get the context error it understands (one request, no retries stripping betas, which a 400
for a field it sent would cause), proving every field it sends was accepted. `--bare`, Claude
Code's own minimal mode, fits (~1,200 tokens) and completes the turn. The tool turn needs a
model that calls tools: `--model qwen2.5-coder-0.5b` (MLX_SERVE_TOOL_MODEL overrides it, for a
folder), skipped when the server cannot load it. After the tool result, Qwen2.5-Coder (0.5B
and 1.5B alike, greedy, whatever the prompt asks) calls Bash again instead of answering: that
turn is an expected failure, the round trip before it is asserted. Default settings on the
0.5B: ~12,400 tokens of prefill, about six minutes on a 2-core CPU.
"""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

from mlx_serve.engine.model.tokenizer import ChatTokenizer
from mlx_serve.protocols import anthropic_messages
from mlx_serve.protocols.anthropic_request import MESSAGES_DECODER, InputMessage, MessagesBody
from mlx_serve.protocols.contract import Defaults, ProtocolContext
from tests.e2e import clis
from tests.support.server_proc import ServerProcess, access_count

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        not clis.installed("claude", clis.CLAUDE_CODE), reason="Claude Code not installed (scripts/test.sh)"
    ),
]
TOOL_MODEL = os.environ.get("MLX_SERVE_TOOL_MODEL", "qwen2.5-coder-0.5b")
MARKER = "mlx-serve-ok"
TOOL_TURN = ("--bare", "--tools", "Bash", "--allowedTools", "Bash", "--max-turns", "2")


@pytest.fixture(scope="module")
def smollm(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = clis.serve(str(smollm_path), tmp_path_factory.mktemp("logs") / "claude-smollm.log")
    yield server
    server.close()


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = clis.serve(TOOL_MODEL, optional=True, log=tmp_path_factory.mktemp("logs") / "claude-tools.log")
    yield server
    server.close()


def result_of(run: clis.Run) -> dict[str, Any]:
    [result] = run.of_type("result")
    return result


def assistant_blocks(run: clis.Run) -> list[dict[str, Any]]:
    return [b for e in run.of_type("assistant") for b in e["message"]["content"]]


def test_default_request_is_accepted_and_too_long_for_an_8k_model(
    smollm: ServerProcess, tmp_path: Path
) -> None:
    run = clis.claude(smollm.url, tmp_path, "say hi")
    result = result_of(run)
    assert run.rc == 1 and result["is_error"] and result["terminal_reason"] == "prompt_too_long"
    assert "maximum context length is 8192 tokens" in result["result"]
    lines = [ln for ln in smollm.log().splitlines() if "route=/v1/messages " in ln]
    assert len(lines) == 1 and "status=400" in lines[0] and "error=context_too_long" in lines[0]


def test_bare_mode_completes_a_turn_on_smollm2(smollm: ServerProcess, tmp_path: Path) -> None:
    run = clis.claude(smollm.url, tmp_path, "say hi", "--bare")
    result = result_of(run)
    assert run.rc == 0, run.stderr
    assert (result["subtype"], result["is_error"], result["stop_reason"]) == ("success", False, "end_turn")
    texts = [b["text"] for b in assistant_blocks(run) if b["type"] == "text"]
    assert texts and texts[-1].strip() and result["result"] == texts[-1]
    [init] = [e for e in run.of_type("system") if e.get("subtype") == "init"]
    assert init["model"] == clis.MODEL and init["analytics_disabled"] is True


@pytest.mark.timeout(1800)
def test_calls_its_bash_tool_and_gets_the_result_back(tool_model: ServerProcess, tmp_path: Path) -> None:
    prompt = f"Use the Bash tool to run the command `echo {MARKER}`, then tell me what it printed."
    # Two model turns at most, each at most 400 tokens: minutes of CPU decoding, not hours.
    run = clis.claude(
        tool_model.url, tmp_path, prompt, *TOOL_TURN, env={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "400"}
    )
    uses = [b for b in assistant_blocks(run) if b["type"] == "tool_use"]
    assert uses and uses[0]["name"] == "Bash" and MARKER in uses[0]["input"]["command"], run.stdout[-2000:]
    results = [b for e in run.of_type("user") for b in e["message"]["content"]
               if isinstance(b, dict) and b.get("type") == "tool_result"]  # fmt: skip
    assert results and MARKER in str(results[0]["content"]) and not results[0].get("is_error")
    lines = [ln for ln in tool_model.log().splitlines() if "route=/v1/messages " in ln]
    assert len(lines) >= 2 and all("status=200" in ln for ln in lines)  # every turn answered
    # The turn after the tool resends the conversation: it starts from the first turn's cache
    # (all of its prompt but a partial last block of 256 tokens), and Claude Code is told so.
    assert access_count(lines[1], "cached_tokens") >= access_count(lines[0], "prompt_tokens") - 256 > 0, (
        lines[:2]
    )
    turns = [e["message"]["usage"] for e in run.of_type("assistant")]
    assert max(u.get("cache_read_input_tokens") or 0 for u in turns) > 0, turns
    result = result_of(run)
    if len(uses) > 1:  # the 0.5B asked for the tool again instead of answering: the CLI's --max-turns
        assert result["subtype"] == "error_max_turns", run.stdout[-2000:]
    else:
        assert run.rc == 0 and not result["is_error"], run.stdout[-2000:]


@pytest.mark.timeout(3600)
def test_default_settings_complete_a_turn(tool_model: ServerProcess, tmp_path: Path) -> None:
    run = clis.claude(tool_model.url, tmp_path, "say hi", timeout_s=3000)
    assert run.rc == 0 and result_of(run)["subtype"] == "success", run.stdout[-2000:]


# --- what two sessions in different folders share ------------------------------------------------


class _Capture(http.server.BaseHTTPRequestHandler):
    """Keeps each request body Claude Code sends and answers 400, so it stops at once."""

    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers.get("content-length", 0))))
        out = b'{"type":"error","error":{"type":"invalid_request_error","message":"captured"}}'
        self.send_response(400)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


def first_request(scratch: Path) -> MessagesBody:
    """Claude Code's first /v1/messages body for `say hi` run in `scratch`/work."""
    _Capture.bodies = []
    server = http.server.HTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        clis.claude(f"http://127.0.0.1:{server.server_address[1]}", scratch, "say hi", timeout_s=120)
    finally:
        server.shutdown()
    body = MESSAGES_DECODER.decode(_Capture.bodies[0])
    assert body.tools and isinstance(body.system, list)
    return body


def test_two_sessions_in_different_folders_share_the_system_prompt_and_tools(
    smollm_path: Path, tmp_path: Path
) -> None:
    from mlx_lm.utils import load_tokenizer

    ctx = ProtocolContext("m", ChatTokenizer(load_tokenizer(smollm_path)), Defaults(), 0)
    one, two = first_request(tmp_path / "project-one"), first_request(tmp_path / "elsewhere" / "two")
    # The folders differ in the environment block and in the system prompt's memory folder.
    assert one.system != two.system and one.messages[-1] != two.messages[-1]
    first, second = (anthropic_messages.render(r, ctx).ids for r in (one, two))
    common = next(i for i, (x, y) in enumerate(zip(first, second, strict=False)) if x != y)
    # Where the system prompt and tools end: the first token a different conversation changes.
    alone = msgspec.structs.replace(one, messages=[InputMessage("user", "x")])
    head = anthropic_messages.render(alone, ctx).ids
    system_and_tools = next(i for i, (x, y) in enumerate(zip(first, head, strict=False)) if x != y)
    assert common >= 0.9 * system_and_tools > 8000, (common, system_and_tools)
    assert "x-anthropic-billing-header" not in ctx.tokenizer.decode(first)
