"""Tier 3, engine level: quantized KV (`--kv-bits`) on the batched and lone-row lanes, real models.

- parity: each prompt through our 8-bit lane, alone and batched, equals mlx-lm's own
  generate_step with kv_bits=8, quantized_kv_start=0 and its QuantizedKVCache from the first
  token (engine.rows.quantized_kv says why from the first) token for token;
- the rows' caches are quantized on both lanes (batched and a row alone).
Agreement with unquantized KV, and of rows batched against alone over longer outputs, are
measured, not asserted: docs/kv-quantization.md has the figures and why they fall short.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache

from mlx_serve.engine.batch.runner import BatchRunner
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.rows.quantized_kv import BatchQuantizedKVCache
from mlx_serve.engine.types import Request, SamplingParams
from tests.engine.batch.test_runner import QUESTIONS, drive, prompt_ids

PROMPTS = QUESTIONS + [
    "Explain what a hash map is in two sentences.",
    "List the planets of the solar system.",
    "Write a Python function that reverses a string.",
    "Why is the sky blue?",
]
NEW_TOKENS = 48


def _load(path: Path) -> tuple[Any, Any]:
    from mlx_lm import load

    from mlx_serve.engine.model.loader import maybe_dequantize

    model, tokenizer = load(str(path))
    return maybe_dequantize(model, "always"), tokenizer  # as the server runs it on a CPU


@pytest.fixture(scope="module")
def smollm(smollm_path: Path) -> tuple[Any, Any]:
    return _load(smollm_path)


def lane(
    model: Any,
    requests: list[Request],
    kv: tuple[int, int] | None,
    *,
    step: int = 2048,
    rows: int = 4,
    arrivals: dict[int, list[Request]] | None = None,
    eos: frozenset[int] = frozenset(),
) -> dict[str, list[int]]:
    sched = Scheduler(SchedulerConfig(max_running=rows, max_prefilling=2, token_budget=step), eos)
    runner = BatchRunner(model, prefill_step_size=step, kv_quantization=kv)
    return drive(runner, sched, arrivals or {0: requests})


def alone(model: Any, requests: list[Request], kv: tuple[int, int] | None, **kw: Any) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for r in requests:
        out.update(lane(model, [r], kv, **kw))
    return out


def mlx_lm_tokens(model: Any, prompt: tuple[int, ...], n: int, bits: int, eos: frozenset[int]) -> list[int]:
    out: list[int] = []
    layers = len(make_prompt_cache(model))
    steps = generate_step(
        mx.array(prompt),
        model,
        max_tokens=n,
        prompt_cache=[QuantizedKVCache(group_size=64, bits=bits) for _ in range(layers)],
        kv_bits=bits,
        kv_group_size=64,
        quantized_kv_start=0,
    )
    for token, _ in steps:
        out.append(int(token))
        if token in eos:
            break
    return out


def requests_for(tokenizer: Any, n: int = NEW_TOKENS) -> list[Request]:
    return [Request(f"r{i}", prompt_ids(tokenizer, q), SamplingParams(), n) for i, q in enumerate(PROMPTS)]


def test_8bit_lane_matches_mlx_lm_quantized_kv_greedy(smollm: tuple[Any, Any]) -> None:
    """Alone (the lone-row lane: mlx-lm's QuantizedKVCache over our buffers) and four rows at
    once, every row equals mlx-lm's generate_step on its QuantizedKVCache at 8 bits."""
    model, tokenizer = smollm
    eos = frozenset(tokenizer.eos_token_ids)
    requests = requests_for(tokenizer, 24)[:6]
    want = {r.id: mlx_lm_tokens(model, r.prompt_tokens, r.max_tokens, 8, eos) for r in requests}
    assert alone(model, requests, (8, 64), eos=eos) == want
    assert lane(model, requests, (8, 64), eos=eos) == want


def test_rows_hold_quantized_caches_on_both_lanes(smollm: tuple[Any, Any]) -> None:
    """Rows decoding together hold quantized batch caches, a row alone mlx-lm's QuantizedKVCache:
    packed integers either way."""
    model, tokenizer = smollm
    runner = BatchRunner(model, kv_quantization=(8, 64))
    short, long = requests_for(tokenizer, 2)[0], requests_for(tokenizer, 5)[1]
    sched = Scheduler(SchedulerConfig(max_running=2, max_prefilling=2, token_budget=2048), frozenset())
    sched.add(short)
    sched.add(long)
    seen: set[type] = set()
    while sched.has_work:
        plan = sched.schedule()
        for sid in plan.admitted:
            seq = sched.get(sid)
            assert seq is not None
            runner.admit(seq.request)
        sched.update(plan, runner.step(plan))
        for c in runner._gen.prompt_cache:
            seen.add(type(c))
            held = c.qkeys if isinstance(c, BatchQuantizedKVCache) else c.keys
            assert held is not None and held[0].dtype == mx.uint32
    assert seen == {BatchQuantizedKVCache, QuantizedKVCache}
