"""Tier 1: the memory-fit model on tiny random models, and the per-request verdict."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.nn.layers.base import Module
from mlx.nn.layers.quantized import quantize
from mlx_lm.models import gemma3_text, llama, mamba
from mlx_lm.models.cache import QuantizedKVCache

from mlx_serve.engine.batch.admission import (
    MAX_ROWS_FROM_MEMORY,
    ROW_SHARE_TOKENS,
    Admission,
    InsufficientMemory,
    MemoryPlan,
    admit,
    plan_memory,
    plan_rows,
    rows_that_fit,
)
from mlx_serve.engine.errors import ContextTooLong, InvalidRequest
from mlx_serve.engine.model.memory_budget import default_budget, total_ram_bytes
from mlx_serve.engine.model.memory_probe import KV_ALLOC_STEP, KvCost, weights_bytes

MIB = 1 << 20
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 2, 64, 4, 2, 128, 256
HEAD_DIM = HIDDEN // HEADS


def tiny_llama(max_context: int | None = 8192, dtype: mx.Dtype = mx.float32) -> llama.Model:
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        intermediate_size=FFN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB,
        tie_word_embeddings=True,
        max_position_embeddings=max_context,
    )
    model = llama.Model(args)
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def tiny_gemma3(window: int = 8, pattern: int = 3, layers: int = 6) -> gemma3_text.Model:
    args = gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=64,
        num_hidden_layers=layers,
        intermediate_size=128,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        vocab_size=VOCAB,
        sliding_window=window,
        sliding_window_pattern=pattern,
        query_pre_attn_scalar=32,
    )
    model = gemma3_text.Model(args)
    mx.eval(model.parameters())
    return model


def plan(
    model: Module,
    budget: int | None = 64 * MIB,
    *,
    step: int = 128,
    max_context: int | None = None,
    max_running: int = 1,
) -> MemoryPlan:
    return plan_memory(
        model, budget_bytes=budget, prefill_step_size=step, max_context=max_context, max_running=max_running
    )


@pytest.fixture(scope="module")
def model() -> llama.Model:
    return tiny_llama()


def test_kv_bytes_per_token_is_two_layers_heads_dims_dtype(model: llama.Model) -> None:
    assert plan(model).kv_bytes_per_token == 2 * LAYERS * KV_HEADS * HEAD_DIM * 4


def test_kv_bytes_per_token_follows_the_dtype() -> None:
    assert plan(tiny_llama(dtype=mx.bfloat16)).kv_bytes_per_token == 2 * LAYERS * KV_HEADS * HEAD_DIM * 2


def test_weights_bytes_is_the_parameter_sum(model: llama.Model) -> None:
    params = (
        VOCAB * HIDDEN
        + LAYERS * (2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS * HEAD_DIM + 3 * HIDDEN * FFN + 2 * HIDDEN)
        + HIDDEN
    )
    assert weights_bytes(model) == params * 4
    assert plan(model).weights_bytes == params * 4


def test_weights_bytes_counts_quantized_weights_packed() -> None:
    model = tiny_llama()
    quantize(model, group_size=32, bits=4)
    mats = [(VOCAB, HIDDEN)] + LAYERS * [
        (HIDDEN, HIDDEN),
        (KV_HEADS * HEAD_DIM, HIDDEN),
        (KV_HEADS * HEAD_DIM, HIDDEN),
        (HIDDEN, HIDDEN),
        (FFN, HIDDEN),
        (FFN, HIDDEN),
        (HIDDEN, FFN),
    ]
    packed = sum(o * i // 2 + 2 * o * (i // 32) * 4 for o, i in mats)  # 4 bits + f32 scales, biases
    norms = (2 * LAYERS + 1) * HIDDEN * 4
    assert weights_bytes(model) == packed + norms
    assert plan(model).weights_bytes == packed + norms


def test_a_speculating_plan_charges_drafts_and_holes(model: llama.Model) -> None:
    plain = plan(model, 8 * MIB, max_running=4)
    spec = plan_memory(
        model, budget_bytes=8 * MIB, prefill_step_size=128, max_context=None, max_running=4, draft_tokens=3
    )
    # Physically a speculating batch may hold its tokens, 1/16 more in holes, and per row its
    # drafts and 32 more holes: all of it within the budget.
    held = spec.kv_capacity_tokens * 17 // 16 + 4 * (3 + 32)
    used = spec.weights_bytes + spec.prefill_transient_bytes + 4 * spec.kv.step_slack
    assert used + held * spec.kv_bytes_per_token <= spec.budget.nbytes
    assert spec.kv_capacity_tokens < plain.kv_capacity_tokens
    assert spec.context_limit <= spec.kv_capacity_tokens


def test_plan_fits_its_budget_and_is_tight(model: llama.Model) -> None:
    p = plan(model, 8 * MIB, max_running=4)
    used = p.weights_bytes + p.prefill_transient_bytes + 4 * p.kv.step_slack
    assert used + p.kv_capacity_tokens * p.kv_bytes_per_token <= p.budget.nbytes
    assert p.context_limit <= p.kv_capacity_tokens
    bigger = plan(model, 8 * MIB + 64 * 1024, max_running=4)
    assert bigger.context_limit > p.context_limit


def test_context_limit_shrinks_with_the_budget(model: llama.Model) -> None:
    limits = [plan(model, b * MIB).context_limit for b in (64, 16, 4, 2)]
    assert limits == sorted(limits, reverse=True)
    assert limits[0] == 8192  # the model's own maximum caps it
    assert limits[-1] < limits[1] < 8192


def test_context_limit_takes_the_operator_cap(model: llama.Model) -> None:
    assert plan(model, max_context=1000).context_limit == 1000
    unknown = tiny_llama(max_context=None)
    assert plan(unknown, 4 * MIB).context_limit == plan(model, 4 * MIB).context_limit


def test_refuses_to_start_below_the_weights(model: llama.Model) -> None:
    with pytest.raises(InsufficientMemory, match="weights take 353.2 KiB"):
        plan(model, weights_bytes(model) // 2)


def test_refuses_to_start_when_no_request_fits(model: llama.Model) -> None:
    just_weights = weights_bytes(model) + plan(model).kv.step_slack + 1024
    with pytest.raises(InsufficientMemory, match="room for [01] tokens"):
        plan(model, just_weights)


def test_admit_passes_what_fits(model: llama.Model) -> None:
    verdict = admit(plan(model, max_context=100), 40, 60)
    assert verdict == Admission(60, 60, 100)
    assert not verdict.clamped and verdict.warning is None


def test_admit_clamps_max_tokens_and_says_so(model: llama.Model) -> None:
    verdict = admit(plan(model, max_context=8192), 300, 100000)
    assert verdict.max_tokens == 7892 and verdict.clamped
    assert verdict.warning == '299 - "max_tokens clamped from 100000 to 7892 to fit the 8192-token context"'


def test_admit_rejects_a_prompt_that_alone_does_not_fit(model: llama.Model) -> None:
    p = plan(model, max_context=100)
    with pytest.raises(ContextTooLong, match="maximum context length is 100 tokens.*prompt has 100 tokens"):
        admit(p, 100, 10)
    assert admit(p, 99, 10).max_tokens == 1


def test_admit_rejects_nonpositive_max_tokens(model: llama.Model) -> None:
    with pytest.raises(InvalidRequest, match="max_tokens"):
        admit(plan(model), 10, 0)


def test_context_too_long_is_a_400() -> None:
    assert ContextTooLong("x").status == 400


def test_gemma3_sliding_layers_are_charged_per_window() -> None:
    model = tiny_gemma3(window=8, pattern=3, layers=6)  # layers 2 and 5 global, the rest sliding
    kv = plan(model).kv
    per_layer = 2 * 1 * 32 * 4
    assert kv.per_token == 2 * per_layer
    assert kv.window_per_token == 4 * per_layer
    assert kv.window_full == 8 * 4 * per_layer
    assert kv.per_sequence == 0


def test_gemma3_windows_give_more_context_than_full_attention() -> None:
    sliding = plan(tiny_gemma3(window=8, pattern=6), 32 * MIB, step=16)
    everywhere = plan(tiny_gemma3(window=8, pattern=1), 32 * MIB, step=16)
    assert everywhere.kv.window_per_token == 0
    assert sliding.kv_capacity_tokens > everywhere.kv_capacity_tokens


def test_windowed_capacity_reserves_windows_for_every_running_sequence() -> None:
    model = tiny_gemma3(window=64, pattern=6)
    few, many = plan(model, 32 * MIB, max_running=1), plan(model, 32 * MIB, max_running=64)
    assert many.kv_capacity_tokens < few.kv_capacity_tokens
    reserved = many.weights_bytes + many.prefill_transient_bytes + 64 * many.kv.step_slack
    by_window = reserved + 64 * many.kv.window_full + many.kv_capacity_tokens * many.kv.per_token
    by_token = reserved + many.kv_capacity_tokens * (many.kv.per_token + many.kv.window_per_token)
    assert min(by_window, by_token) <= many.budget.nbytes


def test_step_slack_is_one_allocation_step(model: llama.Model) -> None:
    kv = plan(model).kv
    assert kv.step_slack == (KV_ALLOC_STEP - 1) * kv.per_token


def test_describe_names_the_numbers(model: llama.Model) -> None:
    text = plan(model, 64 * MIB, max_context=1000).describe()
    assert "budget 64.0 MiB (--memory-budget)" in text and "512 B/token" in text
    assert "context 1,000 tokens (model: 8,192)" in text


def test_default_budget_is_a_share_of_this_machine() -> None:
    budget = default_budget()
    assert 0 < budget.nbytes < total_ram_bytes() or mx.default_device().type == mx.DeviceType.gpu
    assert budget.source


def test_state_space_models_cost_a_fixed_state_per_sequence() -> None:
    args = mamba.ModelArgs(
        model_type="mamba",
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        state_size=8,
        num_hidden_layers=2,
        conv_kernel=4,
        use_bias=False,
        use_conv_bias=True,
        time_step_rank=8,
    )
    p = plan(mamba.Model(args), max_running=4)
    conv, ssm = (4 - 1) * 128 * 4, 128 * 8 * 4  # per layer: conv window and SSM state, float32
    assert p.kv == KvCost(per_sequence=2 * (conv + ssm))
    assert "unbounded tokens in all" in p.describe()


def test_quantized_kv_cache_counts_packed_keys_scales_and_biases() -> None:
    class QuantizedKvLlama(llama.Model):
        def make_cache(self) -> list[QuantizedKVCache]:
            return [QuantizedKVCache(group_size=32, bits=8) for _ in self.layers]

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=128,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=VOCAB,
    )
    head_dim = 32
    per_head = head_dim * 8 // 8 + 2 * (head_dim // 32) * 4  # 8-bit packed, f32 scale and bias
    assert plan(QuantizedKvLlama(args)).kv_bytes_per_token == 2 * 2 * 2 * per_head


def test_the_probe_does_not_evaluate_the_model() -> None:
    model = llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=1024,
            num_hidden_layers=4,
            intermediate_size=4096,
            num_attention_heads=8,
            num_key_value_heads=8,
            rms_norm_eps=1e-5,
            vocab_size=32000,
        )
    )
    before = mx.get_active_memory()
    p = plan(model, 1 << 30)
    assert p.weights_bytes > 200 * MIB and mx.get_active_memory() - before < MIB
    assert p.kv_bytes_per_token == 2 * 4 * 8 * 128 * 4


def test_rows_that_fit_give_each_row_its_share_and_stop_at_the_cap(model: llama.Model) -> None:
    p = plan(model, 64 * MIB, max_running=256)
    share = min(p.context_limit, ROW_SHARE_TOKENS)
    assert rows_that_fit(p) == max(1, min(MAX_ROWS_FROM_MEMORY, p.kv_capacity_tokens // share))
    assert rows_that_fit(p, cap=3) == min(3, rows_that_fit(p))
    small = plan_rows(lambda rows: plan(model, 8 * MIB, max_running=rows))  # 256 rows do not plan here
    assert 1 <= small.max_running < rows_that_fit(p)
    assert small.max_running == rows_that_fit(small, small.max_running)


def test_a_gate_with_a_queue_bound_takes_its_rows_from_the_plan(model: llama.Model) -> None:
    from mlx_serve.engine.host.client import Gate

    p = plan(model, 64 * MIB, max_running=7)
    gate, fixed = Gate(1000, waiting=5), Gate(1000)
    gate.size(p)
    fixed.size(p)
    assert (gate.capacity, gate.plan, fixed.capacity) == (12, p, 1000)
