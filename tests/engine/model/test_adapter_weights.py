"""Tier 1: LoRA adapters in mlx-lm's format on a tiny random llama. The engine's weights as served
(maybe_dequantize) keep the adapter's layers and compute what mlx-lm's adapter loading computes,
and the prompt cache's disk folder (its model fingerprint) differs for the base and for each
adapter, so blocks of one are never read by another."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from mlx import nn
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from mlx_lm.tuner.lora import LoRALinear
from mlx_lm.tuner.utils import load_adapters

from mlx_serve.engine.batch.disk_tier import fingerprint
from mlx_serve.engine.model.loader import is_quantized, maybe_dequantize

LORA = {"rank": 4, "dropout": 0.0, "scale": 20.0}


def tiny_llama(seed: int = 0) -> llama.Model:
    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=256,
        tie_word_embeddings=True,
    )
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def write_adapter(folder: Path, seed: int) -> Path:
    """An adapter folder as mlx-lm's trainer writes it, with random (nonzero) LoRA weights."""
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model = tiny_llama()
    model.freeze()
    linear_to_lora_layers(model, 2, LORA)
    mx.random.seed(seed)
    weights = {
        k: mx.random.normal(v.shape) * 0.05
        for k, v in tree_flatten(model.trainable_parameters())
        if isinstance(v, mx.array)
    }
    folder.mkdir(parents=True)
    mx.save_safetensors(str(folder / "adapters.safetensors"), weights)
    config = {"fine_tune_type": "lora", "num_layers": 2, "lora_parameters": LORA}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def adapted(folder: Path | None, quantized: bool = False) -> nn.Module:
    model = tiny_llama()
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
    return load_adapters(model, str(folder)) if folder is not None else model


def logits(model: nn.Module) -> mx.array:
    return model(mx.array([[1, 5, 9, 42, 7, 3]]))  # type: ignore[no-any-return]


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return write_adapter(tmp_path / "a", seed=1), write_adapter(tmp_path / "b", seed=2)


def test_the_adapter_changes_the_models_output(pair: tuple[Path, Path]) -> None:
    base, a, b = logits(adapted(None)), logits(adapted(pair[0])), logits(adapted(pair[1]))
    assert not mx.allclose(base, a, atol=1e-3) and not mx.allclose(a, b, atol=1e-3)


def test_a_quantized_base_served_as_float32_keeps_its_adapter_and_its_output(pair: tuple[Path, Path]) -> None:
    model = adapted(pair[0], quantized=True)
    reference = logits(model)  # mlx-lm's adapter over the quantized layers
    served = maybe_dequantize(model, "always")
    assert not is_quantized(served)
    assert sum(isinstance(m, LoRALinear) for _, m in served.named_modules()) == 2 * 7  # q k v o gate up down
    assert mx.allclose(logits(served), reference, atol=1e-3)


def test_the_disk_cache_folder_differs_for_the_base_and_each_adapter(pair: tuple[Path, Path]) -> None:
    names = {fingerprint(adapted(folder), 256) for folder in (None, *pair)}
    assert len(names) == 3
    assert fingerprint(adapted(pair[0]), 256) == fingerprint(adapted(pair[0]), 256)  # stable across loads
