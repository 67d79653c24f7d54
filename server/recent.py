"""GET /stats/recent: the requests in flight and the last ones that ended, newest first.

The request observer tells `RecentRequests` when a request begins and ends. Only calls that
reach for the model are kept (POSTs to a route we serve, and anything handed to the engine): the
page's own polls, probes, static files and scanners' paths would crowd out what a reader wants. Bounded: `capacity` ended
requests, and at most as many in flight.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import orjson

from mlx_serve.protocols.contract import Receive, Scope, Send
from mlx_serve.server.metrics import RequestDone
from mlx_serve.server.observe import RequestRecord, Watcher, trace_line
from mlx_serve.server.routes import OTHER
from mlx_serve.server.writer import send_json

CAPACITY = 50


def shown(record: RequestRecord) -> bool:
    """A call for the model: not a probe, a poll, a page file or a path we do not serve."""
    model_call = record.method == "POST" or record.submitted is not None
    return model_call and not record.probe and record.route != OTHER


def live_phase(record: RequestRecord) -> str:
    """Where a request in flight is: reading its body, being parsed and templated, waiting for
    its first token (admission and prefill), or decoding."""
    if record.body_read is None:
        return "receiving"
    if record.submitted is None:
        return "parsing"
    if all(c.first_token is None for c in record.choices.values()):
        return "prefill"
    return "decoding"


def live_entry(record: RequestRecord, now: float) -> dict[str, Any]:
    firsts = [c.first_token for c in record.choices.values() if c.first_token is not None]
    first = min(firsts) - record.arrived if firsts else None
    submitted = None if record.submitted is None else record.submitted - record.arrived
    return {
        "id": record.id or None,
        "method": record.method,
        "route": record.route,
        "status": None,
        "phase": live_phase(record),
        "arrived_unix": record.arrived_unix,
        "elapsed_s": round(now - record.arrived, 6),
        "prompt_tokens": record.prompt_tokens,
        "completion_tokens": sum(c.deltas for c in record.choices.values()),
        "ttft_s": _rounded(first),
        "phases_s": {"submitted": _rounded(submitted), "first_token": _rounded(first)},
    }


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)


def ended_entry(record: RequestRecord, done: RequestDone) -> dict[str, Any]:
    """The request's --trace line with its phase, its time to first token and why it was refused."""
    line = trace_line(record, done)
    ttfts = [c.ttft_s for c in done.choices if c.ttft_s is not None]
    line.update(
        phase="done",
        elapsed_s=round(done.duration_s, 6),
        ttft_s=round(min(ttfts), 6) if ttfts else None,
        refusal=record.refusal or None,
    )
    return line


class RecentRequests(Watcher):
    """The request observer's record of recent calls, read by GET /stats/recent."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._open: dict[int, RequestRecord] = {}
        self._ended: deque[dict[str, Any]] = deque(maxlen=capacity)

    def begin(self, record: RequestRecord) -> None:
        self._open[id(record)] = record

    def end(self, record: RequestRecord, done: RequestDone) -> None:
        self._open.pop(id(record), None)
        if shown(record):
            self._ended.appendleft(ended_entry(record, done))

    def snapshot(self) -> dict[str, Any]:
        now = time.perf_counter()
        live = sorted((r for r in self._open.values() if shown(r)), key=lambda r: -r.arrived)
        return {
            "in_flight": [live_entry(r, now) for r in live[: self.capacity]],
            "ended": list(self._ended),
            "at": time.time(),
        }

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, orjson.dumps(self.snapshot()))
