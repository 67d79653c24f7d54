"""Sampling values valid as float64 but degenerate in float32 behave as their limit: greedy."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlx_serve.engine.rows.sampling import make_row_sampler
from mlx_serve.engine.types import SamplingParams


def _logprobs(seed: int) -> mx.array:
    logits = mx.random.normal((1, 512), key=mx.random.key(seed)) * 4
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=1e-39, seed=1),
        SamplingParams(temperature=5e-324),
        SamplingParams(temperature=0.7, top_p=1e-46, seed=2),
        SamplingParams(temperature=1.0, top_p=5e-324),
    ],
    ids=["temperature-1e-39", "temperature-denormal", "top_p-1e-46", "top_p-denormal"],
)
def test_degenerate_float32_sampling_picks_the_most_likely_token(sampling: SamplingParams) -> None:
    sampler = make_row_sampler(sampling)
    for seed in range(20):
        logprobs = _logprobs(seed)
        assert sampler(logprobs).item() == mx.argmax(logprobs, axis=-1).item()
