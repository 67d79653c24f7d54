"""Tier 3: a quantized model served as float32 is dequantized once; later starts load the copy."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from mlx_serve.engine.gguf import derived
from mlx_serve.engine.model import dequantized
from mlx_serve.engine.model.loader import is_quantized, load_model, prepare


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLX_SERVE_CACHE", str(tmp_path))
    return tmp_path


def test_the_second_load_reads_the_float32_copy_with_the_same_weights(
    smollm_path: Path, cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec = prepare(str(smollm_path))
    assert json.loads((smollm_path / "config.json").read_text()).get("quantization")  # Q4_1 kept quantized
    caplog.set_level(logging.INFO, logger="mlx_serve.loader")
    first = load_model(spec)
    copy = dequantized.copy_folder(smollm_path, cache)
    assert copy.is_dir() and "quantization" not in json.loads((copy / "config.json").read_text())
    assert (copy / "tokenizer.json").is_file()
    caplog.clear()
    second = load_model(spec)
    assert any("float32 copy of" in r.getMessage() for r in caplog.records)
    assert not is_quantized(first.model) and not is_quantized(second.model)
    ours, theirs = dict(tree_flatten(first.model.parameters())), dict(tree_flatten(second.model.parameters()))
    assert ours.keys() == theirs.keys()
    assert all(ours[k].dtype == mx.float32 and mx.array_equal(ours[k], theirs[k]).item() for k in ours)
    prompt = mx.array([first.tokenizer.encode("The capital of France is")])
    assert mx.array_equal(first.model(prompt), second.model(prompt)).item()


def test_a_changed_model_folder_gets_a_new_copy(smollm_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    for f in smollm_path.iterdir():
        os.symlink(f, folder / f.name)
    before = dequantized.copy_folder(folder, tmp_path)
    assert dequantized.copy_folder(folder, tmp_path) == before
    (folder / "config.json").unlink()
    (folder / "config.json").write_text((smollm_path / "config.json").read_text() + "\n")
    assert dequantized.copy_folder(folder, tmp_path) != before


def _source(folder: Path, config: str = "{}") -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(config)
    (folder / "model.safetensors").write_bytes(b"quantized weights stand-in")
    return folder


def test_writing_a_copy_deletes_those_whose_model_folder_is_gone_or_changed(tmp_path: Path) -> None:
    from mlx import nn

    model, root = nn.Linear(2, 2), tmp_path / "cache"
    a, b = _source(tmp_path / "a"), _source(tmp_path / "b")
    old_a, old_b = dequantized.copy_folder(a, root), dequantized.copy_folder(b, root)
    dequantized.save_copy(model, a, old_a)
    dequantized.save_copy(model, b, old_b)
    assert old_a.is_dir() and old_b.is_dir()  # two live models: both copies stay
    unnamed = root / "float32" / "from-an-older-version"  # names no source: never guessed at
    unnamed.mkdir()
    for f in a.iterdir():
        f.unlink()
    a.rmdir()  # a temporary model folder, deleted since
    (b / "config.json").write_text('{"changed": true}')  # b re-converted: its copy has a new key
    new_b = dequantized.copy_folder(b, root)
    assert new_b != old_b
    dequantized.save_copy(model, b, new_b)
    assert new_b.is_dir() and not old_a.exists() and not old_b.exists() and unnamed.is_dir()
    assert json.loads((new_b / derived.SOURCE_FILE).read_text()) == {"source": str(b.resolve())}
