"""Tier 1: the prefix cache's lookups, copies and caps (engine.batch.prefix_cache)."""

from __future__ import annotations

import mlx.core as mx

from mlx_serve.engine.batch.prefix_cache import PrefixCache, common_prefix
from mlx_serve.engine.model.mlx_boundary import KVCache, RotatingKVCache

H, D, LAYERS = 2, 4, 2


def layers(n: int, seed: int) -> list[KVCache]:
    out = []
    for layer in range(LAYERS):
        mx.random.seed(seed * 10 + layer)
        c = KVCache()
        c.update_and_fetch(mx.random.normal((1, H, n, D)), mx.random.normal((1, H, n, D)))
        out.append(c)
    return out


def test_common_prefix() -> None:
    assert common_prefix((1, 2, 3, 4), (1, 2, 9)) == 2
    assert common_prefix((1, 2), (1, 2, 3)) == 2
    assert common_prefix((5,), (6,)) == 0
    a = tuple(range(1000))
    assert common_prefix(a, a[:613] + (-1,) + a[614:]) == 613


def test_lookup_finds_the_longest_prefix_any_entry_holds_and_leaves_one_token() -> None:
    cache = PrefixCache(max_entries=8, max_bytes=1 << 30)
    a, b = tuple(range(10)), (0, 1, 2, 3, 4, 5, 50, 51)
    cache.store(list(a), layers(10, 1))
    cache.store(list(b), layers(8, 2))
    found, n = cache.lookup((0, 1, 2, 3, 4, 5, 6, 7, 99))  # 8 tokens of a
    assert n == 8 and found is not None
    found, n = cache.lookup(a)  # all of a: one token is left to compute
    assert n == 9
    found, n = cache.lookup((0, 1, 2, 3, 4, 5, 50, 60))
    assert n == 7
    assert cache.lookup((7, 7, 7)) == (None, 0)
    assert (cache.stats.lookups, cache.stats.hits, cache.stats.cached_tokens) == (4, 3, 24)


def test_a_hit_is_the_entrys_first_positions_and_writing_past_them_leaves_the_entry_alone() -> None:
    cache = PrefixCache(max_entries=8, max_bytes=1 << 30)
    entry = layers(10, 3)
    saved = [mx.array(c.keys) for c in entry if c.keys is not None]
    cache.store(list(range(10)), entry)
    found, n = cache.lookup((0, 1, 2, 3, 4, 5, 70, 71))
    assert n == 6 and found is not None
    for got, c in zip(found, entry):
        assert isinstance(got, KVCache) and got.keys is not None and c.keys is not None
        assert got.offset == 6 and mx.array_equal(got.keys, c.keys[..., :6, :]).item()
        got.update_and_fetch(mx.ones((1, H, 3, D)), mx.ones((1, H, 3, D)))  # the row's own prefill
        assert got.keys is not None and mx.array_equal(got.keys[..., 6:9, :], mx.ones((1, H, 3, D))).item()
    for c, before in zip(entry, saved):
        assert c.keys is not None and mx.array_equal(c.keys, before).item()


def test_caps_evict_the_least_recently_stored_and_a_longer_entry_replaces_its_prefixes() -> None:
    per_entry = sum(c.nbytes for c in layers(4, 0))
    cache = PrefixCache(max_entries=3, max_bytes=1 << 30)
    for i in range(3):
        cache.store([100 * i + t for t in range(4)], layers(4, i))
    cache.lookup((0, 1, 2, 3))  # a lookup is not a use (ranks of a sharded group evict alike)
    cache.store([300, 301, 302, 303], layers(4, 3))
    assert len(cache) == 3 and cache.lookup((0, 1, 2, 3, 9)) == (None, 0)
    assert cache.lookup((100, 101, 102, 103))[1] == 3
    assert cache.nbytes == 3 * per_entry

    cache.store([100, 101, 102, 103, 104, 105, 106, 107], layers(8, 4))  # extends entry 100, which goes
    assert len(cache) == 3 and cache.lookup((100, 101, 102, 103, 104, 105, 106, 107, 108))[1] == 8

    small = PrefixCache(max_entries=10, max_bytes=2 * per_entry)
    for i in range(3):
        small.store([100 * i + t for t in range(4)], layers(4, i))
    assert len(small) == 2 and small.nbytes == 2 * per_entry
    assert PrefixCache(max_entries=0, max_bytes=1 << 30).lookup((1, 2)) == (None, 0)


def test_an_entry_that_cannot_be_trimmed_serves_only_as_a_whole() -> None:
    cache = PrefixCache(max_entries=4, max_bytes=1 << 30)
    rotating = []
    for _ in range(LAYERS):
        c = RotatingKVCache(max_size=4)
        c.update_and_fetch(mx.ones((1, H, 6, D)), mx.ones((1, H, 6, D)))  # wrapped: not trimmable
        rotating.append(c)
    cache.store(list(range(6)), rotating)
    assert cache.lookup((0, 1, 2, 3, 9)) == (None, 0)  # would need a trim
    found, n = cache.lookup((0, 1, 2, 3, 4, 5, 6))  # all of it, with a token left over
    assert n == 6 and found is not None and found[0] is not rotating[0]


def test_a_prefix_shorter_than_the_minimum_hit_is_computed_again() -> None:
    cache = PrefixCache(max_entries=4, max_bytes=1 << 30, min_hit=6)
    cache.store(list(range(10)), layers(10, 5))
    assert cache.lookup((0, 1, 2, 3, 4, 99)) == (None, 0)  # 5 tokens in common
    assert cache.lookup((0, 1, 2, 3, 4, 5, 99))[1] == 6
