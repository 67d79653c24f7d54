"""The numbers a benchmark prints: percentiles, a level's summary, medians over rounds, ratios."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, replace

from bench.load import LevelResult, RequestRecord

# A request the transport lost: no status, or a stream cut before its end.
DROPPED_MARKS = ("Error:", "stream ended without [DONE]", "Timeout")


@dataclass(frozen=True, slots=True)
class LevelSummary:
    server: str
    concurrency: int
    ok: int
    errors: int
    dropped: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    decode_p50_tps: float | None
    aggregate_tps: float
    completion_tokens: int
    wall_s: float
    error_samples: list[str]


def percentile(values: list[float], pct: float) -> float | None:
    """Linear interpolation between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def is_dropped(record: RequestRecord) -> bool:
    """Lost by the transport (refused, reset, cut short), not answered with an error."""
    error = record.error or ""
    return bool(error) and (record.status is None or any(m in error for m in DROPPED_MARKS))


def summarize(server: str, level: LevelResult) -> LevelSummary:
    ok = [r for r in level.records if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    decodes = [r.decode_tps for r in ok if r.decode_tps is not None]
    tokens = sum(r.num_tokens for r in ok)
    return LevelSummary(
        server=server,
        concurrency=level.concurrency,
        ok=len(ok),
        errors=len(level.records) - len(ok),
        dropped=sum(is_dropped(r) for r in level.records),
        ttft_p50_ms=_scaled(percentile(ttfts, 50), 1000),
        ttft_p95_ms=_scaled(percentile(ttfts, 95), 1000),
        decode_p50_tps=percentile(decodes, 50),
        aggregate_tps=tokens / level.wall_s if level.wall_s > 0 else 0.0,
        completion_tokens=tokens,
        wall_s=level.wall_s,
        error_samples=sorted({r.error for r in level.records if r.error})[:3],
    )


def _median_of(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_summary(rounds: list[LevelSummary]) -> LevelSummary:
    """One level over rounds: the median of each rate and time, the sum of the counts."""
    first = rounds[0]
    return replace(
        first,
        ok=sum(s.ok for s in rounds),
        errors=sum(s.errors for s in rounds),
        dropped=sum(s.dropped for s in rounds),
        ttft_p50_ms=_median_of([s.ttft_p50_ms for s in rounds]),
        ttft_p95_ms=_median_of([s.ttft_p95_ms for s in rounds]),
        decode_p50_tps=_median_of([s.decode_p50_tps for s in rounds]),
        aggregate_tps=statistics.median(s.aggregate_tps for s in rounds),
        completion_tokens=sum(s.completion_tokens for s in rounds),
        wall_s=statistics.median(s.wall_s for s in rounds),
        error_samples=sorted({e for s in rounds for e in s.error_samples})[:3],
    )


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


HEADER = f"{'':<14} {'ok/err':>9} {'dropped':>8} {'TTFT p50':>10} {'TTFT p95':>10} {'decode p50':>11} {'aggregate':>10}"


def level_table(concurrency: int, summaries: list[LevelSummary], direct_tps: float | None) -> str:
    """One client count: a row per server (TTFT in ms, rates in tok/s), and direct mlx-lm's:
    `stream_generate`'s decode rate at 1 client, `batch_generate`'s end-to-end rate at B = C."""
    lines = [f"\n== {concurrency} client(s) ==", HEADER]
    for s in summaries:
        lines.append(
            f"{s.server:<14} {f'{s.ok}/{s.errors}':>9} {s.dropped:>8} {fmt(s.ttft_p50_ms):>10} "
            f"{fmt(s.ttft_p95_ms):>10} {fmt(s.decode_p50_tps):>11} {fmt(s.aggregate_tps):>10}"
        )
        lines += [f"   error: {e}" for e in s.error_samples]
    blank = f"{'direct mlx-lm':<14} {'':>9} {'':>8} {'':>10} {'':>10}"
    if direct_tps is not None and concurrency == 1:  # stream_generate's decode rate
        lines.append(f"{blank} {fmt(direct_tps):>11}")
    elif direct_tps is not None:  # batch_generate at B = C, end to end
        lines.append(f"{blank} {'':>11} {fmt(direct_tps):>10}")
    return "\n".join(lines)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def ratio_lines(by_level: dict[int, dict[str, LevelSummary]], direct: dict[int, float]) -> list[str]:
    """mlx-serve against mlx_lm.server and against direct mlx-lm, per client count."""
    lines = ["\n== ratios (mlx-serve / reference) =="]
    for c, row in sorted(by_level.items()):
        ours, theirs = row.get("mlx-serve"), row.get("mlx_lm")
        if ours and theirs:
            agg = ratio(ours.aggregate_tps, theirs.aggregate_tps)
            ttft = ratio(ours.ttft_p95_ms, theirs.ttft_p95_ms)
            lines.append(
                f"{c:>3} clients  vs mlx_lm.server: aggregate {fmt(agg, 2)}x, TTFT p95 {fmt(ttft, 2)}x "
                f"(lower is better), dropped {ours.dropped} vs {theirs.dropped}"
            )
        if ours and c == 1 and c in direct:
            got = ratio(ours.decode_p50_tps, direct[c])
            lines.append(f"{c:>3} client   vs direct mlx-lm stream_generate: decode {fmt(got, 3)}x")
        elif ours and c in direct:
            got = ratio(ours.aggregate_tps, direct[c])
            lines.append(f"{c:>3} clients  vs direct mlx-lm batch_generate: aggregate {fmt(got, 3)}x")
    return lines if len(lines) > 1 else [*lines, "(nothing to compare: a contestant is missing)"]


def gap_stats(gaps_ms: list[float]) -> str:
    """p50 / p99 / max of inter-token gaps, in ms."""
    if not gaps_ms:
        return "no gaps"
    return (
        f"p50 {fmt(percentile(gaps_ms, 50))} ms, p99 {fmt(percentile(gaps_ms, 99))} ms, "
        f"max {fmt(max(gaps_ms))} ms (n={len(gaps_ms)})"
    )


def rate_line(name: str, rs: list[float], reference: list[float], width: int = 13) -> str:
    """A contender's median rate [range] and, unless it is the reference, its ratio to the
    reference round by round: median [range] (and a 95% interval from 20 rounds)."""
    line = f"  {name:<{width}} {statistics.median(rs):8.1f} tok/s [{min(rs):.1f}-{max(rs):.1f}]"
    if rs is not reference:
        ratios = [r / d for r, d in zip(rs, reference, strict=True) if d]
        line += f"  {statistics.median(ratios):.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]"
        if len(ratios) >= 20:
            lo, hi = median_interval(ratios)
            line += f" 95% CI of the median {lo:.3f}-{hi:.3f}"
    return line


def median_interval(xs: list[float], draws: int = 4000, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval for the median of `xs` (percentile method, fixed seed): how far
    the median ratio of a run could move on rounds drawn from the same machine's spread."""
    rng = random.Random(seed)
    meds = [statistics.median(rng.choices(xs, k=len(xs))) for _ in range(draws)]
    lo, hi = percentile(meds, 2.5), percentile(meds, 97.5)
    assert lo is not None and hi is not None
    return lo, hi
