"""Per-row samplers and logits processors, built from mlx-lm's sampling pieces.

A seeded row carries its own PRNG key, split once per sampled token, so its text does not
depend on what else shares the batch. Greedy rows share one sampler object, which lets the
batch sample them with one argmax.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from mlx_serve.engine.model.mlx_boundary import (
    LogitsProcessor,
    Sampler,
    apply_min_p,
    apply_top_k,
    apply_top_p,
    greedy_sampler,
    make_logits_processors,
)
from mlx_serve.engine.types import MIN_TOP_P, SamplingParams


class RowSampler:
    """A non-greedy row's sampler: its filters, temperature and (when seeded) its own key."""

    def __init__(self, s: SamplingParams) -> None:
        self._filters = _filters(s)
        self._inv_temp = 1.0 / s.temperature
        self._key = mx.random.key(s.seed) if s.seed is not None else None

    def _scaled(self, logprobs: mx.array) -> mx.array:
        for f in self._filters:
            logprobs = f(logprobs)
        return logprobs * self._inv_temp

    def __call__(self, logprobs: mx.array) -> mx.array:
        if self._key is None:
            return mx.random.categorical(self._scaled(logprobs))
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(self._scaled(logprobs), key=sub)

    def many(self, logprobs: mx.array) -> tuple[mx.array, Callable[[int], None]]:
        """One token per row of `logprobs` (consecutive positions of one sequence), and a
        commit(m) that leaves the key as if only the first m had been sampled."""
        if self._key is None:
            return mx.random.categorical(self._scaled(logprobs)), lambda m: None
        keys, subs = [self._key], []
        for _ in range(logprobs.shape[0]):
            nxt, sub = mx.random.split(keys[-1])
            keys.append(nxt)
            subs.append(sub)
        scaled = self._scaled(logprobs)
        tokens = mx.concatenate(
            [mx.random.categorical(scaled[j : j + 1], key=sub) for j, sub in enumerate(subs)]
        )

        def commit(m: int) -> None:
            self._key = keys[m]

        return tokens, commit


def make_row_sampler(s: SamplingParams) -> Sampler:
    return greedy_sampler if s.greedy else RowSampler(s)


def _filters(s: SamplingParams) -> list[Callable[[mx.array], mx.array]]:
    out: list[Callable[[mx.array], mx.array]] = []
    if 0 < s.top_p < 1.0:
        top_p = max(s.top_p, MIN_TOP_P)  # one that float32 rounds to 0 would keep no token
        out.append(lambda x: apply_top_p(x, top_p))
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
