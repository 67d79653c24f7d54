"""Per-row KV cuts (engine.speculation.cut_cache): rows of one batch cache drop different trailing counts.

The invariant a user's text depends on: after any sequence of writes, cuts, compactions,
joins and leaves, a row's next query attends to exactly the keys of the tokens it kept, at the
positions they had, so its attention output equals that of a cache that only ever held them.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from mlx_serve.engine.speculation.cut_cache import CutKVCache, cut_rows

H, D = 2, 4


def rows_cache(lengths: list[int], seed: int = 0) -> tuple[list[Any], list[mx.array]]:
    """A left-padded batch cache holding rows of these lengths, and each row's keys."""
    mx.random.seed(seed)
    rows = [mx.random.normal((1, H, n, D)) for n in lengths]
    longest = max(lengths)
    cache = BatchKVCache([longest - n for n in lengths])
    k = mx.concatenate([mx.pad(r, [(0, 0), (0, 0), (longest - r.shape[2], 0), (0, 0)]) for r in rows])
    cache.update_and_fetch(k, k)
    return [cache], [r for r in rows]


def write(caches: list[Any], kept: list[mx.array], width: int, cut: list[int], seed: int) -> None:
    """Every row writes `width` new positions, then row i drops its last cut[i]."""
    mx.random.seed(seed)
    new = mx.random.normal((len(kept), H, width, D))
    caches[0].update_and_fetch(new, new)
    cut_rows(caches, cut)
    for i, c in enumerate(cut):
        kept[i] = mx.concatenate([kept[i], new[i : i + 1, :, : width - c]], axis=2)


def attention(cache: Any, query: mx.array) -> mx.array:
    """One new query per row through the cache's own mask, as a model's attention runs it."""
    mask = cache.make_mask(1, return_array=True)
    keys, values = cache.update_and_fetch(query, query)
    out = mx.fast.scaled_dot_product_attention(query, keys, values, scale=1.0, mask=mask)
    cache.trim(1)
    return out


def assert_same_as_fresh(cache: Any, kept: list[mx.array]) -> None:
    q = mx.random.normal((len(kept), H, 1, D))
    got = attention(cache, q)
    for i, k in enumerate(kept):
        alone = KVCache()
        alone.update_and_fetch(k, k)
        keys, values = alone.update_and_fetch(q[i : i + 1], q[i : i + 1])
        want = mx.fast.scaled_dot_product_attention(q[i : i + 1], keys, values, scale=1.0, mask=None)
        assert mx.allclose(got[i : i + 1], want, atol=1e-5), f"row {i}"
        assert mx.array_equal(cache.extract(i).keys, k), f"row {i} extract"
    assert cache.offset.tolist() == [k.shape[2] for k in kept]  # each row's next RoPE position


def test_cut_rows_hides_each_rows_own_tail() -> None:
    caches, kept = rows_cache([5, 3])
    write(caches, kept, 4, [3, 1], seed=1)  # row 0 keeps 1 of 4, row 1 keeps 3
    assert isinstance(caches[0], CutKVCache)  # adopted in place in the caller's list
    assert caches[0]._idx == 5 + 4 - 1  # only what every row dropped is trimmed
    assert_same_as_fresh(caches[0], kept)


def test_equal_cuts_make_no_holes() -> None:
    caches, kept = rows_cache([4, 2])
    write(caches, kept, 3, [2, 2], seed=1)
    assert caches[0].holes is None and caches[0]._idx == 5
    assert_same_as_fresh(caches[0], kept)


def test_many_cuts_compact_and_stay_exact() -> None:
    caches, kept = rows_cache([6, 2, 9])
    compacted = False
    for step in range(40):
        write(caches, kept, 4, [(step + i) % 4 for i in range(3)], seed=10 + step)
        compacted = compacted or caches[0].holes is None
        assert max(caches[0].counts) < 32  # compaction keeps dead positions bounded
    assert compacted
    assert_same_as_fresh(caches[0], kept)


def test_rows_with_holes_join_and_leave() -> None:
    caches, kept = rows_cache([5, 3, 7])
    write(caches, kept, 4, [3, 0, 1], seed=2)
    caches[0].filter([0, 2])  # row 1 leaves
    kept = [kept[0], kept[2]]
    assert_same_as_fresh(caches[0], kept)
    joining, more = rows_cache([12], seed=3)
    caches[0].extend(joining[0])  # a longer row joins: the others shift right with their holes
    kept += more
    assert_same_as_fresh(caches[0], kept)
    write(caches, kept, 3, [0, 2, 1], seed=4)
    assert_same_as_fresh(caches[0], kept)


def test_every_layer_shares_the_cut() -> None:
    a, _ = rows_cache([4, 6], seed=5)
    b, _ = rows_cache([4, 6], seed=5)
    caches = [a[0], b[0]]
    mx.random.seed(6)
    new = mx.random.normal((2, H, 3, D))
    for c in caches:
        c.update_and_fetch(new, new)
    cut_rows(caches, [0, 2])
    assert all(isinstance(c, CutKVCache) for c in caches)
    assert caches[0].offset.tolist() == caches[1].offset.tolist() == [7, 7]
    assert mx.array_equal(caches[0].make_mask(1), caches[1].make_mask(1))
