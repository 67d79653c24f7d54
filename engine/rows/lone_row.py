"""A generation batch of one row runs mlx-lm's single-stream path.

mlx-lm's batch caches keep each row's position as an array: every layer of every step then adds
one to it (a kernel of its own) and rotates with an array offset. With one row there is nothing
to keep apart, and on an accelerator those extra launches are what a small step costs (a lone
stream ran at 0.91–0.92 of `generate_step` in process on the H200). So while the batch has one
row and steps plainly, its caches are mlx-lm's plain KV caches — the same buffers, no copy, an
int offset — and they become batch caches again, as cheaply, when a row joins, a speculative
step cuts them, or the row leaves. Numerics are those of a lone request either way.

Only plain KV caches take part: a model with rotating, chunked or state caches keeps the batch
caches throughout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx

from mlx_serve.engine.model.mlx_boundary import BatchKVCache, CacheLayer, KVCache, QuantizedKVCache
from mlx_serve.engine.rows.batch_padding import padding_of
from mlx_serve.engine.rows.quantized_kv import BatchQuantizedKVCache, to_batched_quantized, to_plain_quantized

MakeMask = Callable[..., mx.array | None]  # BatchKVCache.make_mask


def _lone_row_mask(original: MakeMask) -> MakeMask:
    """A batch of one row has no padding, so its one new query attends to every key.

    mlx-lm's single-stream path passes no mask at all then; the batch cache builds a padding
    mask every step anyway. A lone target row steps on plain caches (below); this is for the
    one-row batch caches that remain, such as a draft model's following a lone row.
    """

    def make_mask(self: BatchKVCache, N: int, return_array: bool = False, **kwargs: Any) -> mx.array | None:
        if N == 1 and not return_array and self.left_padding.shape[0] == 1:
            return None
        return original(self, N, return_array=return_array, **kwargs)

    return make_mask


if not getattr(BatchKVCache.make_mask, "_mlx_serve", False):
    BatchKVCache.make_mask = _lone_row_mask(BatchKVCache.make_mask)  # type: ignore[method-assign]
    BatchKVCache.make_mask._mlx_serve = True  # type: ignore[attr-defined]


def can_go_plain(caches: Sequence[CacheLayer]) -> bool:
    """Whether a one-row batch's caches are all batch KV caches (so each has a plain twin),
    plain or all quantized (their twin: mlx-lm's QuantizedKVCache)."""
    kinds = {type(c) for c in caches}
    return kinds == {BatchKVCache} or kinds == {BatchQuantizedKVCache}


def to_plain(caches: Sequence[CacheLayer]) -> list[CacheLayer]:
    """One row's batch caches as plain KV caches over the same buffers (its padding sliced off;
    a row alone in its batch has none once mlx-lm's filter has shifted it out)."""
    if caches and isinstance(caches[0], BatchQuantizedKVCache):
        return to_plain_quantized(caches)
    plain: list[CacheLayer] = []
    for c in caches:
        assert isinstance(c, BatchKVCache)
        kv = KVCache()
        if c.keys is not None and c.values is not None:
            pad = padding_of(c)[0]
            kv.keys = c.keys if pad == 0 else c.keys[..., pad:, :]
            kv.values = c.values if pad == 0 else c.values[..., pad:, :]
            kv.offset = c._idx - pad
        plain.append(kv)
    return plain


def to_batched(caches: Sequence[CacheLayer]) -> list[CacheLayer]:
    """Plain KV caches of one row back as batch caches over the same buffers (no padding)."""
    if caches and isinstance(caches[0], QuantizedKVCache):
        return to_batched_quantized(caches)
    batched: list[CacheLayer] = []
    for c in caches:
        assert isinstance(c, KVCache)
        b = BatchKVCache([0])
        if c.keys is not None:
            b.keys, b.values = c.keys, c.values
            b.offset = mx.array([c.offset])
            b._idx = c.offset
        batched.append(b)
    return batched


__all__ = ["can_go_plain", "to_batched", "to_plain"]
