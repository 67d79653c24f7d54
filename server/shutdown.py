"""Graceful shutdown of open generations: on SIGTERM they get a grace period, then are ended.

Hypercorn stops accepting when its shutdown trigger fires and waits `graceful_timeout` for open
connections; an SSE stream would keep its connection open to the end, so the app ends the
streams itself once `--shutdown-timeout-s` has passed: each gets an error frame in its own
format, then its terminal frame, and its engine request is aborted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

log = logging.getLogger("mlx_serve.shutdown")


class Endable(Protocol):
    def end_for_shutdown(self) -> None: ...


class Drain:
    """The open generations, and their end when the server shuts down."""

    def __init__(self) -> None:
        self.draining = False
        self._live: set[Endable] = set()
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._live)

    def add(self, stream: Endable) -> None:
        self._live.add(stream)

    def discard(self, stream: Endable) -> None:
        self._live.discard(stream)

    def begin(self, timeout_s: float) -> None:
        """Start the grace period; a second call (a second signal) ends every stream now."""
        if self.draining:
            self.end_all()
            return
        self.draining = True
        log.info("shutting down: %d open generation(s) get up to %.1fs to finish", len(self), timeout_s)
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self.end_all)

    def end_all(self) -> None:
        if self._live:
            log.warning("shutting down: ending %d generation(s) still running", len(self._live))
        for stream in list(self._live):
            stream.end_for_shutdown()
