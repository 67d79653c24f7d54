"""Tier 1: what --kv-bits does to the memory plan (tiny random models), and its start-up checks."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models import llama

from mlx_serve.engine.batch.admission import plan_memory, quantized_kv
from mlx_serve.engine.host.assemble import check_kv_quantization
from mlx_serve.engine.host.settings import EngineSettings
from mlx_serve.engine.model.loader import LoadedModel
from mlx_serve.engine.model.memory_probe import probe_model
from mlx_serve.engine.rows.quantized_kv import BatchQuantizedKVCache, make_quantized_cache
from mlx_serve.server.config import load_config
from tests.engine.batch.test_admission import MIB, tiny_gemma3

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 128


def tiny_llama(dtype: mx.Dtype = mx.float32, head_dim: int = HEAD_DIM) -> llama.Model:
    """A 2-layer random llama whose head dimension a quantization group divides (as real ones)."""
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=4 * head_dim,
        num_hidden_layers=LAYERS,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=KV_HEADS,
        rms_norm_eps=1e-5,
        vocab_size=256,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    )
    model = llama.Model(args)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def loaded(model: object) -> LoadedModel:
    return LoadedModel(model, None, "tiny", Path("tiny"))


@pytest.mark.parametrize(("bits", "group"), [(8, 64), (4, 64), (8, 32), (4, 128)])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_the_plan_charges_what_a_quantized_row_holds(bits: int, group: int, dtype: mx.Dtype) -> None:
    """The planned bytes per token equal a quantized cache's bytes after 256 tokens, per layer."""
    model = tiny_llama(dtype=dtype)
    planned = quantized_kv(probe_model(model).kv, dtype.size, bits, group).per_token
    caches = make_quantized_cache(model, bits, group)
    assert len(caches) == LAYERS
    held = 0
    for c in caches:
        assert isinstance(c, BatchQuantizedKVCache)
        k = mx.ones((1, KV_HEADS, 256, HEAD_DIM), dtype=dtype)
        c.update_and_fetch(k, k)
        held += c.nbytes
    assert planned * 256 == held


def test_more_tokens_fit_at_8_and_4_bits() -> None:
    model = tiny_llama()
    plans = {
        bits: plan_memory(
            model,
            budget_bytes=64 * MIB,
            prefill_step_size=256,
            max_context=256,  # the same transient for all three: the KV's bytes alone differ
            max_running=4,
            kv_quantization=None if bits is None else (bits, 64),
        )
        for bits in (None, 8, 4)
    }
    full, eight, four = (plans[b].kv_capacity_tokens for b in (None, 8, 4))
    assert eight > 3 * full  # float32 (4 bytes) against 1 byte + 1/8 for scales and biases
    assert four > 1.7 * eight
    assert "KV" in plans[8].describe()


def test_a_model_with_rotating_caches_is_refused_at_start_up() -> None:
    gemma = loaded(tiny_gemma3())
    with pytest.raises(ValueError, match="--kv-bits: this model has rotating"):
        check_kv_quantization(gemma, EngineSettings(kv_bits=8))
    check_kv_quantization(gemma, EngineSettings())  # unquantized: served as before


def test_a_head_dimension_the_group_does_not_divide_is_refused_at_start_up() -> None:
    model = loaded(tiny_llama(head_dim=48))
    with pytest.raises(ValueError, match="--kv-group-size 64"):
        check_kv_quantization(model, EngineSettings(kv_bits=8))
    check_kv_quantization(loaded(tiny_llama()), EngineSettings(kv_bits=4))


def test_kv_bits_flags() -> None:
    c = load_config(["--kv-bits", "4", "--kv-group-size", "32"])
    assert (c.kv_bits, c.kv_group_size) == (4, 32)
    assert load_config([]).kv_bits is None


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--kv-bits", "3"], "--kv-bits must be one of 4, 8"),
        (["--kv-bits", "8", "--kv-group-size", "48"], "--kv-group-size"),
        (["--kv-bits", "8", "--draft-kind", "ngram"], "--kv-bits cannot be combined with --draft-kind"),
        (["--kv-bits", "8", "--draft-model", "d"], "--kv-bits cannot be combined with --draft-kind"),
    ],
)
def test_kv_bits_refusals_name_the_flag(
    argv: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        load_config(argv)
    assert named in capsys.readouterr().err
