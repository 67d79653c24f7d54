"""bench.step_trace_report: the slow steps it lists are the ones over the bound, with what joined."""

from __future__ import annotations

from typing import Any

from bench.step_trace_report import slow_steps, stretches


def step(t: float, wall: float, rows: int, joined: int, gap: float = 0.0) -> dict[str, Any]:
    phases = {"join.generate": 0.9 * wall} if joined else {"mx.async_eval": 0.95 * wall}
    return {"t": t, "gap": gap, "wall": wall, "rows": rows, "joined": joined, "phases": phases}


def test_slow_steps_lists_each_step_over_the_bound_with_its_joining_rows() -> None:
    steps = [step(10.0, 0.989, 0, 1), step(11.0, 0.145, 1, 0), step(11.2, 2.15, 1, 8), step(13.4, 0.15, 9, 0)]
    out = slow_steps(steps, 0.25).splitlines()
    assert out[0] == " 4 steps, longest 2150 ms; 2 over 250 ms"
    assert out[1].startswith("  at    0.00 s: 989 ms, rows 0, joined 1; join.generate 890")
    assert out[2].startswith("  at    1.20 s: 2150 ms, rows 1, joined 8; join.generate 1935")
    assert len(out) == 3


def test_slow_steps_with_none_over_says_so() -> None:
    assert slow_steps([step(0.0, 0.1, 4, 0)], 0.25) == " 1 steps, longest 100 ms; 0 over 250 ms"
    assert slow_steps([], 0.25) == " no steps"


def test_stretches_split_where_the_engine_went_idle() -> None:
    steps = [step(0.0, 0.1, 1, 0), step(0.1, 0.1, 1, 0, gap=0.01), step(5.0, 0.1, 1, 0, gap=4.8)]
    assert [len(p) for p in stretches(steps)] == [2, 1]
