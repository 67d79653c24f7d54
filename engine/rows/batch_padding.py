"""mlx-lm's batch KV cache, with each row's left padding known on the host too.

mlx-lm keeps a batch cache's left padding only as an array, and reads it back where it needs
a Python number: `filter` (a row leaves) takes its minimum to slice off the padding every row
shares, `extract` (the prefix cache keeps a finished row) its row's value. Reading an array
back waits for everything queued before it on the stream, and in a pipelined engine that is
the decode step already on its way: every step where a row left waited for it, then built the
step's joins and its next forward while the accelerator idled (on the H200 at 64 clients a
step where rows left and others joined cost several plain steps).

So every BatchKVCache also carries its padding as a list, paired with the array it mirrors:
the constructor (and so `merge`), `prepare`, `finalize`, `extend` and `filter` keep the two
in step, and `filter` and `extract` read the list. Whatever else replaces the array (a
speculative cut, `state =`, another subclass) leaves the list paired with an array that is no
longer the cache's, and then these methods read the array as mlx-lm does. The arithmetic is
mlx-lm's own (mlx_lm/models/cache.py, BatchKVCache), done on the list beside it.
"""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx

from mlx_serve.engine.model.mlx_boundary import BatchKVCache, KVCache

_ATTR = "_mlx_serve_padding"  # (the left_padding array it mirrors, its values)
_RIGHT = "_mlx_serve_right_padding"  # prepare()'s right padding, until finalize()


def host_padding(c: BatchKVCache) -> list[int] | None:
    """The cache's left padding per row, if known on the host (no wait for the stream)."""
    pair = getattr(c, _ATTR, None)
    if pair is not None and pair[0] is c.left_padding:
        return cast("list[int]", pair[1])
    return None


def padding_of(c: BatchKVCache) -> list[int]:
    """The cache's left padding per row: from the host when known, else read back."""
    known = host_padding(c)
    return known if known is not None else cast("list[int]", c.left_padding.tolist())


def _pair(c: BatchKVCache, values: list[int]) -> None:
    setattr(c, _ATTR, (c.left_padding, values))


def concat_rows(caches: list[BatchKVCache]) -> BatchKVCache | None:
    """One layer's batch caches as one, rows in order: what extending the first by each of the
    others in turn makes (mlx-lm's `extend`: rows right-justified to the longest write
    position), with one concatenation instead of one per cache, which re-pads the growing batch
    every time. None where a cache is not a plain BatchKVCache with its padding known here."""
    if any(type(c) is not BatchKVCache for c in caches):
        return None
    return _concat(caches)


def _concat(caches: list[BatchKVCache]) -> BatchKVCache | None:
    """concat_rows for any batch KV caches (a subclass's own state is its to extend), into the
    first; None, leaving them untouched, where a cache's padding is not known here."""
    known = [host_padding(c) for c in caches]
    if any(k is None for k in known):
        return None
    pads = cast("list[list[int]]", known)
    out = caches[0]
    if all(c.keys is None for c in caches):
        out.left_padding = mx.concatenate([c.left_padding for c in caches])
        out.offset = mx.concatenate([c.offset for c in caches])
        _pair(out, [p for pad in pads for p in pad])
        return out
    top = max(c._idx for c in caches)
    written = [(c.keys, c.values) for c in caches if c.keys is not None and c.values is not None]
    k0, v0 = written[0]
    heads, k_dim, v_dim, dtype = k0.shape[1], k0.shape[3], v0.shape[3], k0.dtype
    size = max(k.shape[2] for k, _ in written)
    keys, values, padding, shifted = [], [], [], []
    for c, pad in zip(caches, pads):
        k, v = c.keys, c.values
        if k is None or v is None:
            rows = c.offset.shape[0]
            k, v = (
                mx.zeros((rows, heads, 0, k_dim), dtype=dtype),
                mx.zeros((rows, heads, 0, v_dim), dtype=dtype),
            )
        left = top - c._idx
        right = size - k.shape[2] - left
        if right < 0:
            k, v, right = k[..., :right, :], v[..., :right, :], 0
        if left or right:
            k = mx.pad(k, [(0, 0), (0, 0), (left, right), (0, 0)])
            v = mx.pad(v, [(0, 0), (0, 0), (left, right), (0, 0)])
        keys.append(k)
        values.append(v)
        padding.append(c.left_padding + left)
        shifted += [p + left for p in pad]
    out.keys, out.values = mx.concatenate(keys), mx.concatenate(values)
    out.offset = mx.concatenate([c.offset for c in caches])
    out.left_padding = mx.concatenate(padding)
    out._idx = top
    _pair(out, shifted)
    return out


# mlx-lm's own methods, by name: the ones that read the padding back are called only where the
# host copy is not known (and its extend, which concat_rows does for two caches)
MLX: dict[str, Any] = {}


def _install() -> None:
    mlx_init, mlx_prepare = BatchKVCache.__init__, BatchKVCache.prepare  # type: ignore[attr-defined]
    mlx_finalize, mlx_extend = BatchKVCache.finalize, BatchKVCache.extend  # type: ignore[attr-defined]
    MLX.update(filter=BatchKVCache.filter, extract=BatchKVCache.extract, extend=mlx_extend)

    def __init__(self: BatchKVCache, left_padding: list[int]) -> None:
        mlx_init(self, left_padding)
        _pair(self, [int(p) for p in left_padding])

    def prepare(
        self: BatchKVCache, *, left_padding: Any = None, lengths: Any = None, right_padding: Any = None
    ) -> None:
        known = host_padding(self)
        mlx_prepare(self, left_padding=left_padding, lengths=lengths, right_padding=right_padding)
        if known is None:
            return
        if left_padding is not None:
            _pair(self, [p + int(extra) for p, extra in zip(known, left_padding)])
        right = [int(r) for r in right_padding] if right_padding is not None else []
        setattr(self, _RIGHT, right if right and max(right) > 0 else None)

    def finalize(self: BatchKVCache) -> None:
        known, right = host_padding(self), getattr(self, _RIGHT, None)
        if right is not None and len(set(right)) == 1:
            # Every row padded alike (one row joining at a ladder width, the common case): the
            # padding follows each row's own tokens, which causal attention kept from seeing it,
            # so it is trimmed off the end. mlx-lm's roll would move it to the left by a gather
            # over each layer's whole KV, a cached prefix of 12k tokens included.
            self.trim(right[0])
            self._right_padding = None  # type: ignore[attr-defined]
            setattr(self, _RIGHT, None)
            return
        mlx_finalize(self)
        setattr(self, _RIGHT, None)
        if known is not None and right is not None:
            _pair(self, [p + r for p, r in zip(known, right)])

    def extend(self: BatchKVCache, other: BatchKVCache) -> None:
        if _concat([self, other]) is None:  # a padding not known here: mlx-lm's, unpaired
            mlx_extend(self, other)

    def filter_rows(self: BatchKVCache, batch_indices: list[int]) -> None:
        known = host_padding(self)
        if known is None or not isinstance(batch_indices, list) or not batch_indices:
            MLX["filter"](self, batch_indices)
            if self.left_padding.size:
                _pair(self, cast("list[int]", self.left_padding.tolist()))  # read back once
            return
        if self.keys is not None and self.values is not None:
            self.keys = self.keys[batch_indices]
            self.values = self.values[batch_indices]
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        kept = [known[i] for i in batch_indices]
        shared = min(kept)  # padding every remaining row has: sliced off the front
        if shared > 0:
            if self.keys is not None and self.values is not None:
                self.keys = self.keys[..., shared:, :]
                self.values = self.values[..., shared:, :]
            self._idx -= shared
            self.left_padding = self.left_padding - shared
            kept = [p - shared for p in kept]
        _pair(self, kept)

    def extract(self: BatchKVCache, idx: int) -> KVCache:
        known = host_padding(self)
        if known is None or self.keys is None or self.values is None:
            return cast("KVCache", MLX["extract"](self, idx))
        cache = KVCache()
        start = known[idx]
        cache.keys = mx.contiguous(self.keys[idx : idx + 1, :, start : self._idx])
        cache.values = mx.contiguous(self.values[idx : idx + 1, :, start : self._idx])
        cache.offset = cache.keys.shape[2]
        return cache

    BatchKVCache.__init__ = __init__  # type: ignore[method-assign]
    BatchKVCache.prepare = prepare  # type: ignore[attr-defined]
    BatchKVCache.finalize = finalize  # type: ignore[attr-defined]
    BatchKVCache.extend = extend  # type: ignore[method-assign]
    BatchKVCache.filter = filter_rows  # type: ignore[method-assign]
    BatchKVCache.extract = extract  # type: ignore[method-assign]
    BatchKVCache._mlx_serve_padding_installed = True  # type: ignore[attr-defined]


if not getattr(BatchKVCache, "_mlx_serve_padding_installed", False):
    _install()

__all__ = ["concat_rows", "host_padding", "padding_of"]
