"""GET /health every few milliseconds on one keep-alive connection, in a process of its own.

    python -m bench.health_probe URL OUT [--every-ms 10]

Runs until SIGTERM, then writes each probe's latency (ms, one per line) to OUT. A process of its
own, so what it measures is the server's event loop, not the bench's (see bench.loop).
"""

from __future__ import annotations

import argparse
import http.client
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("out", type=Path)
    p.add_argument("--every-ms", type=float, default=10.0)
    args = p.parse_args()
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    parts = urlsplit(args.url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=30)
    waits: list[float] = []
    while not stop:
        began = time.perf_counter()
        conn.request("GET", "/health")
        response = conn.getresponse()
        response.read()
        waits.append((time.perf_counter() - began) * 1000)
        time.sleep(max(0.0, args.every_ms / 1000 - (time.perf_counter() - began)))
    args.out.write_text("".join(f"{w:.3f}\n" for w in waits))


if __name__ == "__main__":
    main()
