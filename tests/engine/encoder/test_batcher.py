"""engine.encoder.batcher: which inputs share a forward."""

from __future__ import annotations

from mlx_serve.engine.encoder.batcher import plan_forwards


def test_plan_forwards_sorts_by_length_and_keeps_every_input_once() -> None:
    lengths = [50, 3, 400, 7, 3, 120]
    forwards = plan_forwards(lengths, max_tokens=512, max_rows=64)
    flat = [i for f in forwards for i in f]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths)


def test_plan_forwards_bounds_padded_tokens_and_rows() -> None:
    lengths = [10] * 30 + [100] * 10
    for f in plan_forwards(lengths, max_tokens=256, max_rows=8):
        assert len(f) <= 8 and len(f) * max(lengths[i] for i in f) <= 256


def test_plan_forwards_gives_an_overlong_input_its_own_forward() -> None:
    assert plan_forwards([5, 5000, 5], max_tokens=1000) == [[0, 2], [1]]


def test_plan_forwards_of_nothing_is_nothing() -> None:
    assert plan_forwards([]) == []
