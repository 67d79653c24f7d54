"""Tier 1: the commands beside serving (server.commands, server.launch) and the fit estimate."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from mlx_serve.engine.model.fit import fit_folder
from mlx_serve.server import commands, launch
from mlx_serve.server.cli import main


def test_serve_takes_the_model_as_its_first_word() -> None:
    assert commands.serve_args(["qwen2.5-coder-0.5b", "--port", "9000"]) == [
        "--model",
        "qwen2.5-coder-0.5b",
        "--port",
        "9000",
    ]
    assert commands.serve_args(["--port", "9000"]) == ["--port", "9000"]


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    main(["help"])
    out = capsys.readouterr().out
    for name in ("serve", "pull", "ls", "rm", "ps", "doctor", "bench", "launch claude|codex", "service"):
        assert f"mlx-serve {name}" in out


def test_ls_and_rm_see_and_remove_cached_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MLX_SERVE_CACHE", str(tmp_path))
    converted = tmp_path / "gguf" / "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M-26faab0c"
    converted.mkdir(parents=True)
    (converted / "config.json").write_text("{}")
    (converted / "model.safetensors").write_bytes(b"\0" * (3 << 20))
    joined = tmp_path / "models" / "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"
    joined.parent.mkdir()
    joined.write_bytes(b"\0" * (1 << 20))
    assert main_code(["ls"]) == 0
    out = capsys.readouterr().out
    assert "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M-26faab0c" in out and "3 MiB" in out
    assert main_code(["rm", "nothing-like-it"]) == 1
    assert main_code(["rm", "qwen2.5-coder-0.5b"]) == 0  # a shortcut names its files
    assert not converted.exists() and not joined.exists()
    main_code(["ls"])
    assert "the model cache is empty" in capsys.readouterr().out


def main_code(argv: list[str]) -> int:
    with pytest.raises(SystemExit) as ended:
        main(argv)
    return int(ended.value.code or 0)


def test_fit_reads_a_folder_without_loading_it(tmp_path: Path) -> None:
    # An 8B-shaped config (32 layers, 8 KV heads of 128): 128 KiB of bf16 KV a token.
    config = {
        "model_type": "llama",
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = {"model.embed_tokens.weight": mx.zeros((1000, 64), dtype=mx.bfloat16)}
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    fit = fit_folder(tmp_path, budget_bytes=(1 << 30) + 128_000, serve_float32=False)
    assert fit.parameters == 64_000
    assert fit.weights_bytes == 128_000
    assert fit.kv_bytes_per_token == 128 * 1024
    assert fit.max_context() == 8192  # 1 GiB of KV at 128 KiB a token
    assert fit.rows_at(4096) == 2
    as_float32 = fit_folder(tmp_path, budget_bytes=1 << 30, serve_float32=True)
    assert as_float32.weights_bytes == 256_000 and as_float32.kv_bytes_per_token == 256 * 1024


def test_launch_parses_its_options_then_passes_the_cli_arguments_through() -> None:
    plan = launch.parse(["--url", "http://127.0.0.1:9/", "--keep-server", "codex", "exec", "--json", "hi"])
    assert (plan.agent, plan.url, plan.keep_server, plan.args) == (
        "codex",
        "http://127.0.0.1:9",
        True,
        ["exec", "--json", "hi"],
    )
    with pytest.raises(ValueError, match="claude or codex"):
        launch.parse(["--model", "x"])
    with pytest.raises(ValueError, match="--port: not an option"):
        launch.parse(["--port", "1", "claude"])


def test_launch_points_claude_code_at_us_for_every_model_role(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLX_SERVE_API_KEY", raising=False)
    plan = launch.parse(["--url", "http://127.0.0.1:9", "claude", "-p", "hi"])
    cmd, env = launch.agent_command(plan, "/bin/claude", "SmolLM2-135M-Instruct")
    assert cmd == ["/bin/claude", "--model", "SmolLM2-135M-Instruct", "-p", "hi"]
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9"
    roles = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL")
    assert all(env[r] == "SmolLM2-135M-Instruct" for r in roles)
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1" and env["DISABLE_TELEMETRY"] == "1"


def test_launch_gives_codex_a_responses_provider_without_touching_its_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLX_SERVE_API_KEY", "sk-local")
    plan = launch.parse(["--url", "http://127.0.0.1:9", "codex", "exec", "hi"])
    cmd, env = launch.agent_command(plan, "/bin/codex", "m")
    overrides = dict(cmd[i + 1].split("=", 1) for i in range(1, len(cmd) - 2, 2) if cmd[i] == "-c")
    assert overrides["model_providers.mlx-serve.base_url"] == '"http://127.0.0.1:9/v1"'
    assert overrides["model_providers.mlx-serve.wire_api"] == '"responses"'
    assert overrides["model_providers.mlx-serve.supports_websockets"] == "true"  # Codex's preferred transport
    assert overrides["model_provider"] == '"mlx-serve"' and overrides["model"] == '"m"'
    assert overrides["analytics.enabled"] == "false"
    assert cmd[-2:] == ["exec", "hi"] and env["MLX_SERVE_API_KEY"] == "sk-local"
