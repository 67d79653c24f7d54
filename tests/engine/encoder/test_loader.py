"""engine.encoder.loader: which `--model` values name an embedding model (without loading one)."""

from __future__ import annotations

from pathlib import Path

from mlx_serve.engine.encoder.loader import is_encoder


def test_a_file_that_is_not_gguf_is_left_to_the_model_loader(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    assert not is_encoder(str(bogus))


def test_shortcuts_and_sentence_transformers_folders_are_encoders(tmp_path: Path) -> None:
    assert is_encoder("all-minilm-l6-v2") and is_encoder("Nomic-Embed-Text-v1.5")
    assert not is_encoder(None) and not is_encoder("qwen2.5-coder-0.5b") and not is_encoder(str(tmp_path))
    (tmp_path / "modules.json").write_text("[]")
    assert is_encoder(str(tmp_path))
