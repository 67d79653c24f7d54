"""Summaries, tables and ratio lines for a side-by-side run."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from bench.load import LevelResult


@dataclass(frozen=True, slots=True)
class LevelSummary:
    server: str
    concurrency: int
    ok: int
    errors: int
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    decode_p50_tps: float | None
    aggregate_tps: float
    completion_tokens: int
    mean_completion_tokens: float | None
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


def summarize(server: str, level: LevelResult) -> LevelSummary:
    ok = [r for r in level.records if r.ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    decodes = [r.decode_tps for r in ok if r.decode_tps is not None]
    tokens = sum(r.num_tokens for r in ok)
    samples = sorted({r.error for r in level.records if r.error})[:3]
    return LevelSummary(
        server=server,
        concurrency=level.concurrency,
        ok=len(ok),
        errors=len(level.records) - len(ok),
        ttft_p50_ms=_scaled(percentile(ttfts, 50), 1000),
        ttft_p95_ms=_scaled(percentile(ttfts, 95), 1000),
        decode_p50_tps=percentile(decodes, 50),
        aggregate_tps=tokens / level.wall_s if level.wall_s > 0 else 0.0,
        completion_tokens=tokens,
        mean_completion_tokens=statistics.fmean(r.num_tokens for r in ok) if ok else None,
        wall_s=level.wall_s,
        error_samples=samples,
    )


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


HEADER = f"{'server':<10} {'ok/err':>8} {'TTFT p50':>10} {'TTFT p95':>10} {'decode p50':>11} {'aggregate':>10} {'tok/req':>8} {'wall s':>7}"


def level_table(concurrency: int, summaries: list[LevelSummary]) -> str:
    """One concurrency level: a row per server (TTFT in ms, speeds in tok/s)."""
    lines = [f"\n== concurrency {concurrency} ==", HEADER]
    for s in summaries:
        lines.append(
            f"{s.server:<10} {f'{s.ok}/{s.errors}':>8} {fmt(s.ttft_p50_ms):>10} {fmt(s.ttft_p95_ms):>10} "
            f"{fmt(s.decode_p50_tps):>11} {fmt(s.aggregate_tps):>10} {fmt(s.mean_completion_tokens, 0):>8} {s.wall_s:>7.1f}"
        )
        lines += [f"   error: {e}" for e in s.error_samples]
    return "\n".join(lines)


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def ratio_lines(by_level: dict[int, dict[str, LevelSummary]], direct_tps: float | None) -> list[str]:
    """mlx-serve vs mlx_lm.server per level, and single-stream serving vs direct mlx-lm."""
    lines = ["\n== ratios =="]
    for c, row in sorted(by_level.items()):
        ours, theirs = row.get("mlx-serve"), row.get("mlx_lm")
        if ours and theirs:
            agg = ratio(ours.aggregate_tps, theirs.aggregate_tps)
            ttft = ratio(ours.ttft_p95_ms, theirs.ttft_p95_ms)
            lines.append(
                f"C={c:<3} mlx-serve/mlx_lm.server aggregate tok/s {fmt(agg, 2)}x   TTFT p95 {fmt(ttft, 2)}x (lower is better)"
            )
    single = by_level.get(1, {})
    for name in ("mlx-serve", "mlx_lm"):
        if name in single and direct_tps:
            r = ratio(single[name].decode_p50_tps, direct_tps)
            lines.append(
                f"single stream {name} decode p50 / direct mlx-lm decode: {fmt(r, 3)} ({fmt(single[name].decode_p50_tps)} / {fmt(direct_tps)} tok/s)"
            )
    return (
        lines if len(lines) > 1 else [*lines, "(nothing to compare: a server or the direct run is missing)"]
    )
