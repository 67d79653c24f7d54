"""One row's own pieces inside a batched step, fenced so that a fault stays that row's.

A batched step calls each row's sampler and logits processors (its penalties, its logit bias,
its grammar) in turn. Should one of them raise, the step would stop half done for every row.
Fenced, the fault is recorded against the row, a harmless stand-in result lets the step finish
for the others, and the runner then reports the row failed and drops it from the batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import mlx.core as mx

from mlx_serve.engine.model.mlx_boundary import LogitsProcessor, Sampler, greedy_sampler

log = logging.getLogger("mlx_serve.engine")


class RowFaults:
    """What went wrong this step, by row uid (the first fault of each row)."""

    def __init__(self) -> None:
        self._by_uid: dict[int, str] = {}

    def record(self, uid: int, exc: BaseException, where: str) -> None:
        if uid in self._by_uid:
            return
        log.error("one request failed in %s (only it is ended)", where, exc_info=exc)
        self._by_uid[uid] = f"{type(exc).__name__}: {exc}"

    def __bool__(self) -> bool:
        return bool(self._by_uid)

    def take(self) -> dict[int, str]:
        found, self._by_uid = self._by_uid, {}
        return found


def fenced_processor(processor: LogitsProcessor, uid: int, faults: RowFaults) -> LogitsProcessor:
    def run(tokens: mx.array, logits: mx.array) -> mx.array:
        try:
            return processor(tokens, logits)
        except Exception as exc:  # noqa: BLE001 - recorded and logged: the row fails alone
            faults.record(uid, exc, "a logits processor")
            return logits

    return run


def fenced_sampler(sampler: Sampler, uid: int, faults: RowFaults) -> Sampler:
    """Greedy rows share mlx-lm's one sampler (the batch samples them with one argmax): it is
    left as it is. A row's own sampler keeps `many`, which speculative verification calls."""
    if sampler is greedy_sampler:
        return sampler
    return FencedSampler(sampler, uid, faults)


class FencedSampler:
    def __init__(self, inner: Sampler, uid: int, faults: RowFaults) -> None:
        self._inner = inner
        self._uid = uid
        self._faults = faults

    def __call__(self, logprobs: mx.array) -> mx.array:
        try:
            return self._inner(logprobs)
        except Exception as exc:  # noqa: BLE001 - recorded and logged: the row fails alone
            self._faults.record(self._uid, exc, "a sampler")
            return greedy_sampler(logprobs)

    def many(self, logprobs: mx.array) -> tuple[mx.array, Callable[[int], None]]:
        try:
            many: Callable[[mx.array], tuple[mx.array, Callable[[int], None]]] = self._inner.many  # type: ignore[attr-defined]
            return many(logprobs)
        except Exception as exc:  # noqa: BLE001 - recorded and logged: the row fails alone
            self._faults.record(self._uid, exc, "speculative verification")
            return greedy_sampler(logprobs), _no_commit


def _no_commit(_accepted: int) -> None:
    return None
