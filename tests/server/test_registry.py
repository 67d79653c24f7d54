"""Tier 1: the many-model registry's pure parts: the models file and flags, name resolution, the
memory budget's arithmetic and the least-recently-used choice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlx_serve.server.budget import Resident, allot, evictions
from mlx_serve.server.config import load_config
from mlx_serve.server.many import entry_config, is_many, model_entries
from mlx_serve.server.models_file import ModelEntry, ModelsFileError, read_models_file
from mlx_serve.server.registry import Registry, Slot

MODELS_TOML = """
[[models]]
name = "coder"
source = "/models/coder"
aliases = ["claude-*", "qwen"]
draft_model = "/models/draft"
tool_call_parser = "hermes"
max_context = 4096
decode_concurrency = 4
idle_unload_s = 600
pinned = true
adapters = { sql = "/adapters/sql" }

[[models]]
name = "small"
source = "qwen2.5-coder-0.5b"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def test_models_file_reads_every_field(tmp_path: Path) -> None:
    coder, small = read_models_file(write(tmp_path, MODELS_TOML))
    assert coder == ModelEntry(
        name="coder", source="/models/coder", aliases=("claude-*", "qwen"), draft_model="/models/draft",
        tool_call_parser="hermes", max_context=4096, decode_concurrency=4, idle_unload_s=600,
        pinned=True, adapters=(("sql", "/adapters/sql"),),
    )  # fmt: skip
    assert small == ModelEntry(name="small", source="qwen2.5-coder-0.5b")


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('[[models]]\nsource = "x"\n', "`name` (a string) is required"),
        ('[[models]]\nname = "a"\nsorce = "x"\n', "unknown keys sorce"),
        ('[[models]]\nname = "a"\nmax_context = -1\n', "`max_context` must be a positive integer"),
        ('[[models]]\nname = "a"\npinned = "yes"\n', "`pinned` must be true or false"),
        ('[[models]]\nname = "a"\nidle_unload_s = -5\n', "`idle_unload_s` must be 0"),
        ('model = "x"\n', "unknown top-level keys model"),
        ("[[models]\n", "--models"),
    ],
)
def test_models_file_mistakes_are_named(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(ModelsFileError, match=re.escape(said)):
        read_models_file(write(tmp_path, text))


def test_repeated_model_flags_name_their_models() -> None:
    config = load_config(
        ["--model", "a=/m/a", "--model", "b=/m/b.gguf", "--pin", "b", "--idle-unload-s", "60"]
    )
    assert is_many(config) and config.model is None
    entries = model_entries(config)
    assert [(e.name, e.source, e.pinned) for e in entries] == [("a", "/m/a", False), ("b", "/m/b.gguf", True)]
    assert config.idle_unload_s == 60


def test_a_config_file_names_models_as_the_flags_do(tmp_path: Path) -> None:
    one = tmp_path / "one.toml"
    one.write_text('model = "coder=/m/coder"\n')
    config = load_config(["--config", str(one)])
    assert is_many(config) and config.model is None
    assert [(e.name, e.source) for e in model_entries(config)] == [("coder", "/m/coder")]
    two = tmp_path / "two.toml"
    two.write_text('model = ["coder=/m/coder", "small=/m/small.gguf"]\npin = ["small"]\n')
    entries = model_entries(load_config(["--config", str(two)]))
    assert [(e.name, e.source, e.pinned) for e in entries] == [
        ("coder", "/m/coder", False),
        ("small", "/m/small.gguf", True),
    ]
    plain = tmp_path / "plain.toml"
    plain.write_text('model = "/models/some=thing/x"\n')
    assert load_config(["--config", str(plain)]).model == "/models/some=thing/x"


def test_plain_model_flag_stays_one_model() -> None:
    config = load_config(["--model", "/models/some=thing/x"])  # a path may hold '=' after a '/'
    assert config.model == "/models/some=thing/x" and not is_many(config)


def test_adapters_give_each_base_a_variant(tmp_path: Path) -> None:
    config = load_config(["--models", str(write(tmp_path, MODELS_TOML)), "--adapter", "chat=/adapters/chat"])
    names = [e.name for e in model_entries(config)]
    assert names == ["coder", "coder:sql", "coder:chat", "small", "small:chat"]
    sql = model_entries(config)[1]
    assert sql.adapter_path == "/adapters/sql" and sql.source == "/models/coder" and not sql.pinned


def test_flag_mistakes_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, said in [
        (["--model", "a=/x", "--model", "a=/y"], "a is given twice"),
        (["--model", "a=/x", "--pin", "b"], "--pin b: no model of that name"),
        (["--pin", "b"], "--pin names a model"),
        (["--adapter", "nopath"], "--adapter wants NAME=VALUE"),
        (["--model", "a=/x", "--shard", "tensor"], "--shard serves one model"),
    ]:
        with pytest.raises(SystemExit):
            load_config(argv)
        assert said in capsys.readouterr().err


def test_an_entry_overrides_the_servers_settings() -> None:
    config = load_config(["--max-context", "8192", "--tool-call-parser", "hermes"])
    entry = ModelEntry(name="c", source="/m/c", draft_model="/m/d", max_context=2048, adapter_path="/a")
    c = entry_config(config, entry, 1 << 30)
    assert (c.model, c.draft_model, c.draft_kind, c.max_context) == ("/m/c", "/m/d", "draft", 2048)
    assert (c.adapter_path, c.memory_budget_bytes, c.tool_call_parser) == ("/a", 1 << 30, "hermes")


def test_names_resolve_to_their_model() -> None:
    coder = Slot(ModelEntry(name="coder", source="/m/coder", aliases=("claude-*", "qwen")))
    small = Slot(ModelEntry(name="small", source="qwen2.5-coder-0.5b"))
    registry = Registry([coder, small], make_engine=lambda e, b: None)  # type: ignore[arg-type,return-value]
    assert registry.resolve(None) is coder and registry.resolve("default") is coder
    assert registry.resolve("qwen") is coder and registry.resolve("claude-sonnet-4-5") is coder
    assert registry.resolve("small") is small and registry.resolve("small:latest") is small
    assert registry.resolve("qwen2.5-coder-0.5b") is small  # its source, as given
    assert registry.resolve("gpt-4") is None
    assert "coder, small" in registry.refusal("gpt-4")


def test_an_engine_gets_its_need_or_an_even_share() -> None:
    assert allot(budget=1000, need=300, free=1000, models=2) == 500
    assert allot(budget=1000, need=700, free=1000, models=2) == 700
    assert allot(budget=1000, need=300, free=400, models=2) == 400  # never more than is free
    assert allot(budget=1000, need=0, free=1000, models=4) == 250


def test_the_least_recently_used_idle_models_go_first() -> None:
    residents = [
        Resident("old", 400, last_used=1.0, evictable=True),
        Resident("busy", 400, last_used=0.5, evictable=False),
        Resident("new", 400, last_used=3.0, evictable=True),
    ]
    assert evictions(residents, free=500, need=300) == []
    assert evictions(residents, free=100, need=300) == ["old"]
    assert evictions(residents, free=100, need=800) == ["old", "new"]
    assert evictions(residents, free=100, need=1000) is None  # the busy one is never chosen


def test_a_plain_model_beside_adapters_keeps_its_served_names() -> None:
    config = load_config(
        [
            "--model",
            "/m/smol",
            "--served-model-name",
            "claude-*",
            "--served-model-name",
            "smol",
            "--adapter",
            "a=/ad",
        ]
    )
    base, variant = model_entries(config)
    assert (base.name, base.source, base.aliases) == ("smol", "/m/smol", ("claude-*",))
    assert (variant.name, variant.adapter_path) == ("smol:a", "/ad")
