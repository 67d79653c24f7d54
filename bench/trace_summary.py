"""Where a server's time to first token went: a summary of mlx-serve's `--trace FILE`.

    python -m bench.trace_summary trace.jsonl [--last N]

Per request, from its arrival at the server (seconds): the body read, the submit to the engine,
the engine's admission wait (queued for a batch row), its first token (engine clock), and the
first write to the socket. Prints p50 / p95 / max of each, so a TTFT tail can be pinned on the
queue, the prefill, the engine-to-server hop or the writer.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import orjson


def phases(line: dict[str, Any]) -> dict[str, float]:
    out = {k: v for k, v in (line.get("phases_s") or {}).items() if v is not None}
    engine = (line.get("engine_s") or [None])[0]
    if engine:
        # the engine's clock starts when it took the request in (else: at the submit)
        submitted = engine["engine_in"] if engine.get("engine_in") is not None else out.get("submitted", 0.0)
        out["engine_in"] = submitted
        out["engine_admission_wait"] = submitted + engine["admission_wait"]
        if engine.get("first_token") is not None:
            out["engine_first_token"] = submitted + engine["first_token"]
            out["prefill_after_admission"] = engine["first_token"] - engine["admission_wait"]
        # The hop: the first delta the engine sent to the server's first (a token's text may be
        # held back for later tokens; traces from before the engine stamped it use the first token).
        first_sent = engine.get("first_delta") or engine.get("first_token")
        if out.get("first_token") is not None and first_sent is not None:
            out["engine_to_server"] = out["first_token"] - (submitted + first_sent)
    return out


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The trace's lines, oldest first."""
    return [orjson.loads(x) for x in path.read_bytes().splitlines() if x.strip()]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(lines: list[dict[str, Any]]) -> str:
    table: dict[str, list[float]] = {}
    for line in lines:
        for name, value in phases(line).items():
            table.setdefault(name, []).append(value)
    rows = [f"{len(lines)} requests; ms from arrival at the server (p50 / p95 / max)"]
    for name, values in table.items():
        rows.append(
            f"  {name:<26} {statistics.median(values) * 1000:9.1f} {quantile(values, 0.95) * 1000:9.1f}"
            f" {max(values) * 1000:9.1f}"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", type=Path)
    p.add_argument("--last", type=int, default=None, help="only the last N requests")
    args = p.parse_args()
    lines = read_trace(args.trace)
    print(summarize(lines[-args.last :] if args.last else lines))


if __name__ == "__main__":
    main()
