from __future__ import annotations

from pathlib import Path

import pytest

from mlx_serve.server.config import load_config


def test_config_defaults_match_mlx_lm_server() -> None:
    c = load_config([])
    assert (c.host, c.port, c.temp, c.top_p, c.top_k, c.min_p, c.max_tokens) == (
        "127.0.0.1",
        8080,
        0.0,
        1.0,
        0,
        0.0,
        512,
    )


def test_config_accepts_mlx_lm_flags() -> None:
    c = load_config(
        [
            "--model",
            "m",
            "--host",
            "0.0.0.0",
            "--port",
            "9",
            "--temp",
            "0.7",
            "--top-p",
            "0.9",
            "--top-k",
            "40",
            "--min-p",
            "0.05",
            "--max-tokens",
            "64",
            "--chat-template",
            "{{x}}",
            "--chat-template-args",
            '{"enable_thinking": false}',
            "--log-level",
            "debug",
        ]
    )
    assert c.model == "m" and c.port == 9 and c.top_k == 40 and c.log_level == "DEBUG"
    assert c.chat_template_args == {"enable_thinking": False}


def test_config_unknown_flag_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_config(["--no-such-flag"])
    assert "unrecognized arguments" in capsys.readouterr().err


def test_config_abbreviated_flag_is_an_error() -> None:
    with pytest.raises(SystemExit):
        load_config(["--mod", "x"])


def test_config_toml_then_flags_win(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('model = "a"\nport = 9001\ntop-k = 5\nprompt_cache_bytes = "2G"\n')
    c = load_config(["--config", str(f), "--port", "9002"])
    assert (c.model, c.port, c.top_k, c.prompt_cache_bytes) == ("a", 9002, 5, 2 << 30)


def test_config_toml_unknown_key_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "c.toml"
    f.write_text("modle = 'typo'\n")
    with pytest.raises(SystemExit):
        load_config(["--config", str(f)])
    assert "modle" in capsys.readouterr().err


def test_config_refuses_kv_bits_it_does_not_serve() -> None:
    with pytest.raises(SystemExit):
        load_config(["--kv-bits", "3"])  # 8 and 4 are served (tests/engine/rows/test_kv_quantization_plan.py)


def test_config_speculation_flags() -> None:
    assert load_config([]).draft_kind is None  # speculation is opt-in
    c = load_config(["--draft-model", "d", "--num-draft-tokens", "5"])
    assert (c.draft_kind, c.draft_model, c.num_draft_tokens) == ("draft", "d", 5)
    assert load_config(["--draft-kind", "ngram"]).draft_kind == "ngram"


def test_config_speculation_gate_reaches_the_engine(capsys: pytest.CaptureFixture[str]) -> None:
    from mlx_serve.server.cli import engine_settings

    assert engine_settings(load_config(["--draft-kind", "ngram"])).speculation_gated is True
    c = load_config(["--draft-kind", "ngram", "--speculation-gate", "off"])
    assert engine_settings(c).speculation_gated is False
    with pytest.raises(SystemExit):
        load_config(["--speculation-gate", "sometimes"])
    assert "--speculation-gate" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["--draft-kind", "draft"],
        ["--draft-kind", "ngram", "--draft-model", "d"],
        ["--draft-kind", "ngram", "--num-draft-tokens", "0"],
        ["--draft-kind", "medusa"],
    ],
)
def test_config_speculation_flag_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        load_config(argv)
    assert "draft" in capsys.readouterr().err


def test_config_tool_call_parser_names_a_family_and_reaches_the_engine(tmp_path: Path) -> None:
    from mlx_serve.server.cli import engine_settings

    assert load_config([]).tool_call_parser is None
    c = load_config(["--tool-call-parser", "qwen3_coder"])
    assert engine_settings(c).tool_call_parser == "qwen3_coder"
    f = tmp_path / "c.toml"
    f.write_text('tool-call-parser = "llama3_json"\n')
    assert load_config(["--config", str(f)]).tool_call_parser == "llama3_json"


@pytest.mark.parametrize("where", ["flag", "toml"])
def test_config_unknown_tool_call_parser_is_an_error(
    tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "c.toml"
    f.write_text('tool_call_parser = "hermes2"\n')
    with pytest.raises(SystemExit):
        load_config(["--tool-call-parser", "hermes2"] if where == "flag" else ["--config", str(f)])
    assert "'hermes2'" in capsys.readouterr().err


def test_config_shard_modes_and_the_pipeline_alias() -> None:
    from mlx_serve.server.cli import engine_settings

    assert load_config([]).shard is None
    assert engine_settings(load_config(["--shard", "tensor"])).shard == "tensor"
    assert load_config(["--pipeline"]).shard == "pipeline"  # mlx_lm.server's flag
    assert load_config(["--pipeline", "--shard", "pipeline"]).shard == "pipeline"


@pytest.mark.parametrize(
    "flags",
    [
        ["--pipeline", "--shard", "tensor"],
        ["--draft-kind", "ngram"],
        ["--draft-model", "d"],
        ["--engine", "thread"],
        ["--adapter-path", "a"],
    ],
)
def test_config_shard_refuses_what_it_cannot_combine_with(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        load_config(flags if "--pipeline" in flags else ["--shard", "tensor", *flags])
    assert "cannot be combined with --shard" in capsys.readouterr().err


def test_config_max_step_ms_reaches_the_engine_in_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    from mlx_serve.server.cli import engine_settings

    assert engine_settings(load_config(["--max-step-ms", "40"])).max_step_s == 0.04
    assert engine_settings(load_config([])).max_step_s is None  # the measured default
    with pytest.raises(SystemExit):
        load_config(["--max-step-ms", "-1"])
    assert "--max-step-ms must be 0 (off) or more" in capsys.readouterr().err


def test_config_reasoning_budget_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_config([]).reasoning_budget == -1  # llama.cpp's default: unbounded
    c = load_config(["--reasoning-budget", "0", "--reasoning-budget-message", "Answer now."])
    assert (c.reasoning_budget, c.reasoning_budget_message) == (0, "Answer now.")
    with pytest.raises(SystemExit):
        load_config(["--reasoning-budget", "-2"])
    assert "--reasoning-budget must be -1" in capsys.readouterr().err


def test_config_engine_watchdog_flags_reach_the_engine() -> None:
    from mlx_serve.server.cli import engine_settings

    default = engine_settings(load_config([]))
    assert default.stall_s == 30 and default.restart_stalled is True
    waiting = engine_settings(load_config(["--engine-stall-s", "5", "--engine-stall-action", "wait"]))
    assert waiting.stall_s == 5 and waiting.restart_stalled is False
    assert engine_settings(load_config(["--engine-stall-s", "0"])).stall_s == 0
