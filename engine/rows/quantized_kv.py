"""A batch KV cache whose keys and values are stored quantized (`--kv-bits 8|4`).

mlx-lm quantizes a lone stream's KV (QuantizedKVCache: each is a `mx.quantize` triple of packed
values, scales and biases, grouped along the head dimension), and its attention dispatches to
`quantized_matmul` when the cache has `bits`; its batch caches are unquantized only. This is its
batch twin: rows left-padded as in BatchKVCache, each row's padding known on the host (as
mlx_serve.engine.rows.batch_padding keeps it for the plain one), and prepare/finalize, filter, extend and
extract doing on each part of the triples what BatchKVCache does on its arrays.

Every write, the first included, attends to the quantized cache: numerics are those of mlx-lm's
generate with a QuantizedKVCache from the first token. (mlx-lm's `kv_bits` with
quantized_kv_start=0 lets its first prefill chunk attend to itself unquantized, so its tokens
depend on where that chunk ends; a batch's chunks end where the step's token budget does, so a
row's text would depend on what else ran beside it.) A row alone steps on mlx-lm's own
QuantizedKVCache (mlx_serve.engine.rows.lone_row), over the same buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import mlx.core as mx

import mlx_serve.engine.rows.batch_padding  # noqa: F401 - BatchKVCache's own methods keep the host padding
from mlx_serve.engine.model.mlx_boundary import (
    BatchKVCache,
    CacheLayer,
    Model,
    QuantizedKVCache,
    make_prompt_cache,
)

Triple = tuple[mx.array, mx.array, mx.array]
KV_BITS = (4, 8)


def _roll(x: mx.array, shifts: mx.array) -> mx.array:
    """x's positions (axis 2) rotated right by each row's shift (mlx-lm's dynamic_roll)."""
    n = x.shape[2]
    idx = (mx.arange(n)[None, None, :, None] - shifts[:, None, None, None]) % n
    return mx.take_along_axis(x, idx, axis=2)


class BatchQuantizedKVCache(BatchKVCache):
    """Left-padded rows whose KV is stored as `mx.quantize` triples (see the module note)."""

    step = 256  # slots are added in steps of this many, as mlx-lm's caches do

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8) -> None:
        super().__init__(left_padding)
        self.qkeys: Triple | None = None
        self.qvalues: Triple | None = None
        self.group_size = group_size
        self.bits = bits  # mlx-lm's attention takes the quantized path for a cache with `bits`
        self._pads = [int(p) for p in left_padding]
        self._right: list[int] | None = None

    def _alloc(self, rows: int, heads: int, slots: int, dim: int, dtype: mx.Dtype) -> Triple:
        per_int = 32 // self.bits
        return (
            mx.zeros((rows, heads, slots, dim // per_int), dtype=mx.uint32),
            mx.zeros((rows, heads, slots, dim // self.group_size), dtype=dtype),
            mx.zeros((rows, heads, slots, dim // self.group_size), dtype=dtype),
        )

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> Any:
        prev, n = self._idx, keys.shape[2]
        if self.qkeys is None or self.qvalues is None or prev + n > self.qkeys[0].shape[2]:
            rows, heads = keys.shape[0], keys.shape[1]
            slots = (self.step + n - 1) // self.step * self.step
            new_k = self._alloc(rows, heads, slots, keys.shape[3], keys.dtype)
            new_v = self._alloc(rows, heads, slots, values.shape[3], values.dtype)
            if self.qkeys is None or self.qvalues is None:
                self.qkeys, self.qvalues = new_k, new_v
            else:
                old_k, old_v = self.qkeys, self.qvalues
                if prev % self.step:
                    old_k = cast("Triple", tuple(x[..., :prev, :] for x in old_k))
                    old_v = cast("Triple", tuple(x[..., :prev, :] for x in old_v))
                self.qkeys = cast(
                    "Triple", tuple(mx.concatenate([a, b], axis=2) for a, b in zip(old_k, new_k))
                )
                self.qvalues = cast(
                    "Triple", tuple(mx.concatenate([a, b], axis=2) for a, b in zip(old_v, new_v))
                )
        self.offset = self.offset + n
        self._idx += n
        qk = mx.quantize(keys, group_size=self.group_size, bits=self.bits)
        qv = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        for store, part in zip(self.qkeys, qk):
            store[..., prev : self._idx, :] = part
        for store, part in zip(self.qvalues, qv):
            store[..., prev : self._idx, :] = part
        return self.keys_and_values()

    def keys_and_values(self) -> Any:
        assert self.qkeys is not None and self.qvalues is not None
        i = self._idx
        return tuple(x[..., :i, :] for x in self.qkeys), tuple(x[..., :i, :] for x in self.qvalues)

    def prepare(self, *, left_padding: Any = None, lengths: Any = None, right_padding: Any = None) -> None:
        if left_padding is not None:
            if self.qkeys is not None:
                raise ValueError("Left padding can only be added to an empty BatchKVCache")
            extra = [int(p) for p in left_padding]
            self.left_padding = self.left_padding + mx.array(extra)
            self.offset = self.offset - mx.array(extra)
            self._pads = [p + e for p, e in zip(self._pads, extra)]
        if right_padding is not None and max(int(r) for r in right_padding) > 0:
            self._right = [int(r) for r in right_padding]

    def finalize(self) -> None:
        if self._right is None or self.qkeys is None or self.qvalues is None:
            self._right = None
            return
        shifts = mx.array(self._right)
        self.qkeys = cast("Triple", tuple(_roll(x, shifts) for x in self.qkeys))
        self.qvalues = cast("Triple", tuple(_roll(x, shifts) for x in self.qvalues))
        self.offset = self.offset - shifts
        self.left_padding = self.left_padding + shifts
        self._pads = [p + r for p, r in zip(self._pads, self._right)]
        self._right = None

    @property
    def state(self) -> Any:
        return self.qkeys, self.qvalues, self.offset, self.left_padding, self._idx

    @state.setter
    def state(self, v: Any) -> None:
        self.qkeys, self.qvalues, self.offset, self.left_padding, self._idx = v
        self._pads = cast("list[int]", self.left_padding.tolist())

    def is_trimmable(self) -> bool:
        return False  # speculation is refused with quantized KV (server.config)

    def filter(self, batch_indices: list[int]) -> None:
        if self.qkeys is not None and self.qvalues is not None:
            self.qkeys = cast("Triple", tuple(x[batch_indices] for x in self.qkeys))
            self.qvalues = cast("Triple", tuple(x[batch_indices] for x in self.qvalues))
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        kept = [self._pads[i] for i in batch_indices]
        shared = min(kept) if kept else 0
        if shared > 0:
            if self.qkeys is not None and self.qvalues is not None:
                self.qkeys = cast("Triple", tuple(x[..., shared:, :] for x in self.qkeys))
                self.qvalues = cast("Triple", tuple(x[..., shared:, :] for x in self.qvalues))
            self._idx -= shared
            self.left_padding = self.left_padding - shared
            kept = [p - shared for p in kept]
        self._pads = kept

    def extend(self, other: BatchKVCache) -> None:
        assert isinstance(other, BatchQuantizedKVCache)
        caches = [self, other]
        if self.qkeys is None and other.qkeys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            self._pads = self._pads + other._pads
            return
        top = max(c._idx for c in caches)
        size = max(c.qkeys[0].shape[2] for c in caches if c.qkeys is not None)
        ref_k = next(c.qkeys for c in caches if c.qkeys is not None)
        ref_v = next(c.qvalues for c in caches if c.qvalues is not None)
        assert ref_k is not None and ref_v is not None
        parts_k: list[Triple] = []
        parts_v: list[Triple] = []
        pads: list[int] = []
        for c in caches:
            rows = c.offset.shape[0]
            k = c.qkeys or cast(
                "Triple", tuple(mx.zeros((rows, *x.shape[1:2], 0, x.shape[3]), x.dtype) for x in ref_k)
            )
            v = c.qvalues or cast(
                "Triple", tuple(mx.zeros((rows, *x.shape[1:2], 0, x.shape[3]), x.dtype) for x in ref_v)
            )
            left = top - c._idx
            right = size - k[0].shape[2] - left
            if right < 0:
                k = cast("Triple", tuple(x[..., :right, :] for x in k))
                v = cast("Triple", tuple(x[..., :right, :] for x in v))
                right = 0
            if left or right:
                width = [(0, 0), (0, 0), (left, right), (0, 0)]
                k = cast("Triple", tuple(mx.pad(x, width) for x in k))
                v = cast("Triple", tuple(mx.pad(x, width) for x in v))
            parts_k.append(k)
            parts_v.append(v)
            pads += [p + left for p in c._pads]
        self.qkeys = cast("Triple", tuple(mx.concatenate(list(xs)) for xs in zip(*parts_k)))
        self.qvalues = cast("Triple", tuple(mx.concatenate(list(xs)) for xs in zip(*parts_v)))
        self.offset = mx.concatenate([c.offset for c in caches])
        self.left_padding = mx.concatenate([c.left_padding + (top - c._idx) for c in caches])
        self._idx = top
        self._pads = pads

    def extract(self, idx: int) -> Any:
        """Row `idx` as mlx-lm's QuantizedKVCache (its padding sliced off)."""
        out = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        if self.qkeys is not None and self.qvalues is not None:
            start = self._pads[idx]
            out.keys = tuple(mx.contiguous(x[idx : idx + 1, :, start : self._idx]) for x in self.qkeys)
            out.values = tuple(mx.contiguous(x[idx : idx + 1, :, start : self._idx]) for x in self.qvalues)
            out.offset = self._idx - start
        return out

    @classmethod
    def merge(cls, caches: Sequence[Any]) -> BatchQuantizedKVCache:
        """One row's own cache as its batch (a prompt batch is admitted one row at a time)."""
        if len(caches) != 1 or not isinstance(caches[0], BatchQuantizedKVCache):
            raise ValueError("quantized KV caches are batched by extend, one row at a time")
        return caches[0]

    def size(self) -> int:
        return int(self._idx)

    def empty(self) -> bool:
        return self.qkeys is None

    @property
    def nbytes(self) -> int:
        if self.qkeys is None or self.qvalues is None:
            return 0
        return sum(x.nbytes for x in (*self.qkeys, *self.qvalues))

    def host_pads(self) -> list[int]:
        return list(self._pads)


def can_quantize(model: Model) -> bool:
    """Whether every layer's cache is a plain KV cache (rotating, chunked or state caches are not
    quantized here)."""
    from mlx_serve.engine.model.mlx_boundary import KVCache

    return all(type(c) is KVCache for c in make_prompt_cache(model))


def make_quantized_cache(model: Model, bits: int, group_size: int) -> list[CacheLayer]:
    """A new row's caches, one a layer, quantized."""
    n = len(make_prompt_cache(model))
    return [BatchQuantizedKVCache([0], group_size, bits) for _ in range(n)]


def to_plain_quantized(caches: Sequence[CacheLayer]) -> list[CacheLayer]:
    """One row's quantized batch caches as mlx-lm's QuantizedKVCache over the same buffers."""
    plain: list[CacheLayer] = []
    for c in caches:
        assert isinstance(c, BatchQuantizedKVCache)
        q = QuantizedKVCache(group_size=c.group_size, bits=c.bits)
        if c.qkeys is not None and c.qvalues is not None:
            pad = c.host_pads()[0]
            q.keys = c.qkeys if pad == 0 else tuple(x[..., pad:, :] for x in c.qkeys)
            q.values = c.qvalues if pad == 0 else tuple(x[..., pad:, :] for x in c.qvalues)
            q.offset = c._idx - pad
        plain.append(q)
    return plain


def to_batched_quantized(caches: Sequence[CacheLayer]) -> list[CacheLayer]:
    """QuantizedKVCaches of one row back as quantized batch caches (no padding, no copy)."""
    batched: list[CacheLayer] = []
    for c in caches:
        assert isinstance(c, QuantizedKVCache)
        b = BatchQuantizedKVCache([0], c.group_size, c.bits)
        if c.keys is not None:
            b.qkeys, b.qvalues = c.keys, c.values
            b.offset = mx.array([c.offset])
            b._idx = c.offset
        batched.append(b)
    return batched


__all__ = [
    "KV_BITS",
    "BatchQuantizedKVCache",
    "can_quantize",
    "make_quantized_cache",
    "to_batched_quantized",
    "to_plain_quantized",
]
