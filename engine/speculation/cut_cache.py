"""Cutting a different number of trailing positions from each row of a batch KV cache.

NOTE, why holes. All rows of mlx-lm's batch cache share one write position, so when row i
drops its last cut[i] positions (rejected drafts) and the rows drop different counts, the cut
tails must go somewhere. Rolling every row right by its extra cut (turning the tail into left
padding) copies the whole cache twice per step — the roll, then a reallocation on the next
write — and launches a handful of kernels per layer: on a CPU that cost more than a plain
decode step. Instead, what every row drops is trimmed, and the rest becomes holes: positions
the attention mask hides. A row's offset (its RoPE position) drops by its whole cut, so its
next token's position follows its last kept token. One holes array (B, positions) serves
every layer. When a row's holes pass a bound (1/16 of the length, at least 32), the batch is
compacted once — one gather per layer moves each row's kept positions right-justified — so
attention never reads more than a few percent of dead positions (and memory admission charges
a speculating server for them: engine.batch.admission.plan_memory's draft_tokens).
"""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx

from mlx_serve.engine.model.mlx_boundary import BatchKVCache, KVCache, create_causal_mask
from mlx_serve.engine.speculation import MIN_HOLES_TO_COMPACT  # engine.batch.admission charges for them


class CutKVCache(BatchKVCache):
    """A batch KV cache whose rows may hold holes (cut positions the mask hides)."""

    holes: mx.array | None  # (B, n) bool, True at a cut position; positions from n on hold none
    counts: list[int]  # holes per row

    def __init__(self, left_padding: list[int]) -> None:
        super().__init__(left_padding)
        self.holes, self.counts = None, [0] * len(left_padding)

    @classmethod
    def adopt(cls, cache: BatchKVCache) -> CutKVCache:
        """The same rows and tensors, as a cache that can hold holes."""
        out = cls([0] * cache.offset.shape[0])
        out.keys, out.values, out.offset, out.left_padding, out._idx = cache.state
        return out

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> mx.array | None:
        if self.holes is None:
            return super().make_mask(N, return_array=return_array, **kwargs)
        mask = create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)
        return mask & ~_fit(self.holes, self._idx + N)[:, None, None, :]

    def filter(self, batch_indices: list[int]) -> None:
        before = self._idx
        super().filter(batch_indices)
        if self.holes is None:
            return
        self.counts = [self.counts[i] for i in batch_indices]
        dropped = before - self._idx  # padding every remaining row had, sliced off the front
        self.holes = self.holes[mx.array(batch_indices)][:, dropped:] if any(self.counts) else None

    def extend(self, other: BatchKVCache) -> None:
        """Both sides are right-justified to the longer one, their holes with them."""
        mine, theirs = self.holes, getattr(other, "holes", None)
        rows, other_rows = self.offset.shape[0], other.offset.shape[0]
        before, other_before = self._idx, other._idx
        other_counts = getattr(other, "counts", [0] * other_rows)
        super().extend(other)
        self.counts = self.counts + list(other_counts)
        if mine is None and theirs is None:
            return
        n = self._idx
        self.holes = mx.concatenate(
            [_placed(mine, rows, n - before, n), _placed(theirs, other_rows, n - other_before, n)]
        )

    def extract(self, idx: int) -> KVCache:
        """Row idx alone, its holes left out (what the prefix cache stores)."""
        if self.holes is None or not self.counts[idx]:
            return super().extract(idx)
        assert self.keys is not None and self.values is not None  # a cut row has been written
        start = int(self.left_padding[idx])
        holes = cast("list[bool]", _fit(self.holes[idx : idx + 1], self._idx)[0].tolist())
        kept = mx.array([p for p in range(start, self._idx) if not holes[p]])
        cache = KVCache()
        cache.keys = mx.contiguous(mx.take(self.keys[idx : idx + 1], kept, axis=2))
        cache.values = mx.contiguous(mx.take(self.values[idx : idx + 1], kept, axis=2))
        cache.offset = cache.keys.shape[2]
        return cache


def cut_rows(caches: list[BatchKVCache], cut: list[int]) -> None:
    """Drop the last cut[i] positions of row i from every layer's batch cache (in place: the
    list's caches become CutKVCaches). See the module note."""
    low, high = min(cut), max(cut)
    if high == 0:
        return
    for i, c in enumerate(caches):
        if not isinstance(c, CutKVCache):
            caches[i] = CutKVCache.adopt(c)
    layers = cast("list[CutKVCache]", caches)  # every layer adopted above
    first = layers[0]
    n = first._idx - low
    offset = first.offset - mx.array(cut)
    holes, counts = first.holes, first.counts
    if high > low:
        at = mx.arange(n)[None, :]
        new = at >= mx.array([n - (c - low) for c in cut])[:, None]
        holes = new if holes is None else new | _fit(holes, n)
        counts = [h + c - low for h, c in zip(counts, cut)]
    for c in layers:
        c._idx, c.offset, c.holes, c.counts = n, offset, holes, counts
    if max(counts) >= max(MIN_HOLES_TO_COMPACT, n // 16):
        compact(layers)


def compact(caches: list[CutKVCache]) -> None:
    """Move each row's kept positions right-justified (holes and padding to its front), then
    slice off the front padding every row has."""
    first = caches[0]
    n = first._idx
    at = mx.arange(n)[None, :]
    kept = (at >= first.left_padding[:, None]) & ~_fit(first.holes, n)
    num_kept = kept.sum(axis=1, keepdims=True)
    # Where each position goes: dead ones to the front in order, kept ones after them in order
    # (a permutation built from running counts: a sort costs seconds on MLX's CUDA backend).
    dest = mx.where(kept, n - num_kept + mx.cumsum(kept, axis=1) - 1, mx.cumsum(~kept, axis=1) - 1)
    order = mx.put_along_axis(mx.zeros((kept.shape[0], n), dtype=mx.int32), dest, at.astype(mx.int32), axis=1)
    common = int((n - num_kept).min())
    order = order[:, common:]
    left_padding = (n - num_kept[:, 0] - common).astype(first.left_padding.dtype)
    for c in caches:
        assert c.keys is not None and c.values is not None  # a cut layer has been written
        gather = order[:, None, :, None]
        c.keys = mx.take_along_axis(c.keys[..., :n, :], gather, axis=2)
        c.values = mx.take_along_axis(c.values[..., :n, :], gather, axis=2)
        c._idx, c.left_padding = n - common, left_padding
        c.holes, c.counts = None, [0] * len(first.counts)


def _fit(holes: mx.array | None, n: int) -> mx.array:
    """Holes over exactly n positions (none past the array's end; none kept past n)."""
    assert holes is not None
    have = holes.shape[1]
    if have >= n:
        return holes[:, :n]
    return mx.pad(holes, [(0, 0), (0, n - have)], constant_values=False)


def _placed(holes: mx.array | None, rows: int, shift: int, n: int) -> mx.array:
    """A side's holes after extend() moved its positions right by shift, over n positions."""
    if holes is None:
        return mx.zeros((rows, n), dtype=mx.bool_)
    return _fit(mx.pad(holes, [(0, 0), (shift, 0)], constant_values=False), n)
