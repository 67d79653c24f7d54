"""Tier 1: batch caches keep each row's left padding on the host (engine.rows.batch_padding).

A row that leaves or is kept by the prefix cache must not read the padding back from the
accelerator (that waits for the decode step already queued); the cache's arrays, offsets and
padding must still be what mlx-lm's own methods make of them.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from mlx_serve.engine.model.mlx_boundary import BatchKVCache, KVCache
from mlx_serve.engine.rows import batch_padding
from mlx_serve.engine.rows.batch_padding import concat_rows, host_padding

H, D = 2, 4


def kv(rows: int, n: int, seed: int) -> tuple[mx.array, mx.array]:
    mx.random.seed(seed)
    return mx.random.normal((rows, H, n, D)), mx.random.normal((rows, H, n, D))


def row(n: int, seed: int) -> KVCache:
    c = KVCache()
    c.update_and_fetch(*kv(1, n, seed))
    return c


def checked(c: BatchKVCache) -> list[int]:
    known = host_padding(c)
    assert known is not None, "the padding is no longer known on the host"
    assert known == c.left_padding.tolist()
    return known


@pytest.fixture
def no_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """mlx-lm's filter and extract read the padding back: with the host copy known they must
    not run at all."""

    def refuse(*_: Any) -> None:
        raise AssertionError("mlx-lm's reading method ran")

    monkeypatch.setitem(batch_padding.MLX, "filter", refuse)
    monkeypatch.setitem(batch_padding.MLX, "extract", refuse)


def test_rows_join_and_leave_with_the_padding_known_on_the_host(no_read_back: None) -> None:
    rows = [row(n, seed) for seed, n in enumerate((5, 2, 7))]
    batch = BatchKVCache.merge(rows)  # left-padded to 7: padding 2, 5, 0
    assert checked(batch) == [2, 5, 0]
    for i, r in enumerate(rows):  # each row's positions are its own, right-justified
        assert r.keys is not None and batch.keys is not None
        n = r.offset
        assert mx.array_equal(batch.keys[i, :, 7 - n : 7], r.keys[0, :, :n]).item()

    joiners = BatchKVCache.merge([row(3, 10), row(1, 11)])
    joiners.prepare(lengths=[4, 6], right_padding=[2, 0])  # a right-padded prefill chunk
    joiners.update_and_fetch(*kv(2, 6, 12))
    joiners.finalize()  # right padding rolled to the left
    assert checked(joiners) == [0 + 2, 2 + 0]  # merge padded row 1 by 2; the chunk padded row 0 by 2
    batch.extend(joiners)  # right-justified to the longer (9 positions)
    assert checked(batch) == [4, 7, 2, 2, 2]
    assert batch._idx == 9

    before = batch.keys
    assert before is not None
    batch.filter([0, 2, 4])  # padding 4, 2, 2: the 2 every row has is sliced off
    assert checked(batch) == [2, 0, 0]
    assert batch._idx == 7
    assert (
        batch.keys is not None and mx.array_equal(batch.keys, before[mx.array([0, 2, 4])][..., 2:, :]).item()
    )
    assert batch.offset.tolist() == [5, 7, 7]  # each row's own length, padding left out

    kept = batch.extract(0)  # what the prefix cache keeps of row 0: its positions, no padding
    assert kept.offset == 5 and kept.keys is not None
    assert mx.array_equal(kept.keys, batch.keys[0:1, :, 2:7]).item()
    batch.filter([1])
    assert checked(batch) == [0]


def test_a_cache_whose_padding_was_replaced_reads_it_back_as_mlx_lm_does() -> None:
    batch = BatchKVCache.merge([row(4, 1), row(2, 2)])
    batch.left_padding = mx.array([1, 2])  # as a speculative cut's compaction does
    assert host_padding(batch) is None
    batch.filter([0, 1])  # mlx-lm's own filter: reads it back, slices the shared 1 off
    assert checked(batch) == [0, 1]
    assert batch._idx == 3


def one_row_batch(n: int, seed: int) -> BatchKVCache:
    """A row as admitted: its cached prefix (n positions, none when 0) in a batch of one."""
    return BatchKVCache.merge([row(n, seed) if n else KVCache()])


@pytest.mark.parametrize("lengths", [(0, 0, 0), (3, 0, 7, 1), (300, 2, 40)])
def test_joining_rows_concatenated_at_once_are_what_extending_one_by_one_makes(
    lengths: tuple[int, ...],
) -> None:
    """Against mlx-lm's own extend (the patched one is concat_rows for two caches), and the
    patched extend, one by one, makes the same with the padding kept on the host."""
    one_by_one, patched = one_row_batch(lengths[0], 0), one_row_batch(lengths[0], 0)
    for i, n in enumerate(lengths[1:], 1):
        batch_padding.MLX["extend"](one_by_one, one_row_batch(n, i))
        patched.extend(one_row_batch(n, i))
    at_once = concat_rows([one_row_batch(n, i) for i, n in enumerate(lengths)])
    assert at_once is not None
    assert at_once._idx == one_by_one._idx == patched._idx
    assert checked(at_once) == one_by_one.left_padding.tolist() == checked(patched)
    assert patched.offset.tolist() == one_by_one.offset.tolist()
    if patched.keys is not None:
        assert one_by_one.keys is not None and patched.values is not None and one_by_one.values is not None
        assert mx.array_equal(patched.keys, one_by_one.keys).item()
        assert mx.array_equal(patched.values, one_by_one.values).item()
    assert at_once.offset.tolist() == one_by_one.offset.tolist()
    if one_by_one.keys is None:
        assert at_once.keys is None
        return
    assert at_once.keys is not None and at_once.values is not None and one_by_one.values is not None
    n = one_by_one._idx
    assert mx.array_equal(at_once.keys[..., :n, :], one_by_one.keys[..., :n, :]).item()
    assert mx.array_equal(at_once.values[..., :n, :], one_by_one.values[..., :n, :]).item()


def test_caches_it_cannot_concatenate_are_left_to_mlx_lm() -> None:
    odd = one_row_batch(2, 1)
    odd.left_padding = mx.array([0])  # padding no longer known here
    assert concat_rows([one_row_batch(3, 0), odd]) is None
