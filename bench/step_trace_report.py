"""Summarize bench/step_trace's files: per stretch of busy steps, plain and join steps' phases.

    python -m bench.step_trace_report DIR [--min-steps 100] [--slow-ms 250]

Steps are split into stretches where the engine went idle for over half a second (the bench's
levels and rounds); per stretch: steps, mean rows, wall time; then for steps without joining
rows and for steps where rows joined, the count, mean and p90 wall time, and the mean time of
each phase per step (phases nest: join holds join.*, next holds mx.async_eval / mx.eval).
With --slow-ms, every step over that wall time is listed, whatever its stretch's length: when it
ran (seconds from the file's first step), its rows, the rows that joined in it and its phases, so
a long prefill (rows joining, the time in join.*) can be told from a stall (issue 19 item 3).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any


def stretches(steps: list[dict[str, Any]], idle: float = 0.5) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    for s in steps:
        if not out or s["gap"] > idle:
            out.append([])
        out[-1].append(s)
    return out


def summary(kind: str, steps: list[dict[str, Any]]) -> str:
    if not steps:
        return f"  {kind}: none"
    walls = sorted(s["wall"] for s in steps)
    per: dict[str, float] = defaultdict(float)
    for s in steps:
        for k, v in s["phases"].items():
            per[k] += v
    parts = ", ".join(
        f"{k} {1e3 * v / len(steps):.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])
    )
    gaps = statistics.mean(s["gap"] for s in steps)
    joined = statistics.mean(s["joined"] for s in steps)
    return (
        f"  {kind}: {len(steps)} steps, wall mean {1e3 * statistics.mean(walls):.1f} ms p90 "
        f"{1e3 * walls[int(0.9 * (len(walls) - 1))]:.1f} ms, gap before {1e3 * gaps:.2f} ms, "
        f"rows joining {joined:.1f}\n    ms per step: {parts}"
    )


def slow_steps(steps: list[dict[str, Any]], over_s: float) -> str:
    slow = [s for s in steps if s["wall"] > over_s]
    walls = sorted(s["wall"] for s in steps)
    out = [
        f" {len(steps)} steps, longest {1e3 * walls[-1]:.0f} ms; {len(slow)} over {1e3 * over_s:.0f} ms"
        if steps
        else " no steps"
    ]
    for s in slow:
        top = sorted(s["phases"].items(), key=lambda kv: -kv[1])[:4]
        parts = ", ".join(f"{k} {1e3 * v:.0f}" for k, v in top)
        out.append(
            f"  at {s['t'] - steps[0]['t']:7.2f} s: {1e3 * s['wall']:.0f} ms, rows {s['rows']}, "
            f"joined {s['joined']}; {parts}"
        )
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--min-steps", type=int, default=100)
    p.add_argument("--slow-ms", type=float, default=None, help="list every step over this wall time")
    args = p.parse_args()
    for f in sorted(Path(args.dir).glob("steps-*.jsonl")):
        head, *lines = f.read_text().splitlines()
        print(f"{f.name} (phases {'synchronized' if json.loads(head)['sync'] else 'as they run, pipelined'})")
        steps = [json.loads(line) for line in lines]
        if args.slow_ms is not None:
            print(slow_steps(steps, args.slow_ms / 1e3))
        for i, part in enumerate(stretches(steps)):
            if len(part) < args.min_steps:
                continue
            wall = part[-1]["t"] + part[-1]["wall"] - part[0]["t"]
            rows = statistics.mean(s["rows"] for s in part)
            tokens = sum(s["rows"] for s in part)
            print(
                f" stretch {i}: {len(part)} steps over {wall:.2f} s, mean rows {rows:.1f}, ~{tokens / wall:,.0f} rows/s"
            )
            print(summary("plain", [s for s in part if not s["joined"]]))
            print(summary("join", [s for s in part if s["joined"]]))


if __name__ == "__main__":
    main()
