"""The 95% interval of a median ratio (bench.report.median_interval)."""

from __future__ import annotations

import random
import statistics

from bench.report import median_interval, rate_line


def _ratios(n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [0.96 * rng.uniform(0.6, 1.4) for _ in range(n)]


def test_interval_holds_the_median_and_narrows_with_rounds() -> None:
    few, many = _ratios(30, 1), _ratios(300, 2)
    lo_few, hi_few = median_interval(few)
    lo_many, hi_many = median_interval(many)
    assert lo_few <= statistics.median(few) <= hi_few
    assert lo_many <= statistics.median(many) <= hi_many
    assert hi_many - lo_many < (hi_few - lo_few) / 2  # ten times the rounds: about a third the width


def test_interval_is_reproducible_and_covers_the_true_median() -> None:
    xs = _ratios(100, 3)
    assert median_interval(xs) == median_interval(xs)
    # The true median of 0.96 * U(0.6, 1.4) is 0.96: over 40 independent runs of 100 rounds, a 95%
    # interval should miss it only a few times.
    misses = sum(
        not (lo <= 0.96 <= hi) for lo, hi in (median_interval(_ratios(100, s), draws=1000) for s in range(40))
    )
    assert misses <= 6


def test_rate_line_prints_the_interval_from_twenty_rounds() -> None:
    ref = [300.0] * 20
    assert "95% CI" in rate_line("ours", [290.0 + i for i in range(20)], ref)
    assert "95% CI" not in rate_line("ours", [290.0 + i for i in range(19)], ref[:19])
