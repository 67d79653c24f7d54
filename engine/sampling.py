"""Per-row samplers and logits processors, built from mlx-lm's sampling pieces.

A seeded row carries its own PRNG key, split once per sampled token, so its text does not
depend on what else shares the batch. Greedy rows share one sampler object, which lets the
batch sample them with one argmax.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import (
    apply_min_p,
    apply_top_k,
    apply_top_p,
    greedy_sampler,
    make_logits_processors,
)

from engine.types import SamplingParams

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]  # (token context, logits) -> logits


def make_row_sampler(s: SamplingParams) -> Sampler:
    if s.greedy:
        return greedy_sampler
    filters = _filters(s)
    inv_temp = 1.0 / s.temperature
    key = mx.random.key(s.seed) if s.seed is not None else None

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        for f in filters:
            logprobs = f(logprobs)
        if key is None:
            return mx.random.categorical(logprobs * inv_temp)
        key, sub = mx.random.split(key)
        return mx.random.categorical(logprobs * inv_temp, key=sub)

    return sample


def _filters(s: SamplingParams) -> list[Callable[[mx.array], mx.array]]:
    out: list[Callable[[mx.array], mx.array]] = []
    if 0 < s.top_p < 1.0:
        out.append(lambda x: apply_top_p(x, s.top_p))
    if s.min_p > 0.0:
        out.append(lambda x: apply_min_p(x, s.min_p, 1))
    if s.top_k > 0:
        out.append(lambda x: apply_top_k(x, s.top_k))
    return out


def make_row_processors(s: SamplingParams) -> list[LogitsProcessor]:
    return make_logits_processors(
        logit_bias=s.logit_bias,
        repetition_penalty=s.repetition_penalty or None,
        repetition_context_size=s.repetition_context_size,
        presence_penalty=s.presence_penalty or None,
        presence_context_size=s.presence_context_size,
        frequency_penalty=s.frequency_penalty or None,
        frequency_context_size=s.frequency_context_size,
    )
