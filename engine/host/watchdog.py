"""The engine watchdog: an engine that holds work but completes no step is not healthy.

While requests are in flight the host asks its engine, every tick, how many steps it has run
(`engine_steps`, answered by the child's reader thread, not the stepping one). When the count
has not moved for `stall_s` (or the child answers nothing at all, as a stopped process does),
the engine is declared not responding: /health says 503 "engine not responding", in-flight
streams get an error frame instead of pausing silently, new requests get 503, and, unless told
otherwise, the engine process is killed and restarted. One that moves again is healthy again.
"""

from __future__ import annotations

from dataclasses import dataclass

STALL_S = 30.0  # no step for this long while work is in flight: not responding
TICK_S = 1.0


@dataclass(slots=True)
class Progress:
    """What the watchdog has seen of the engine: its step count, and when it last moved."""

    stall_s: float = STALL_S
    steps: int = -1
    moved_at: float = 0.0
    busy: bool = False

    def idle(self, now: float) -> None:
        """No work in flight: nothing can be late."""
        self.busy, self.moved_at = False, now

    def saw(self, steps: int, now: float) -> None:
        """The engine's step count, as it answered."""
        if steps != self.steps:
            self.steps, self.moved_at = steps, now

    def moved(self, now: float) -> None:
        """Events came: the engine stepped."""
        self.moved_at = now

    def working(self, now: float) -> None:
        if not self.busy:  # work just arrived: the stall clock starts now
            self.busy, self.moved_at = True, now

    def stalled(self, now: float) -> bool:
        return self.stall_s > 0 and self.busy and now - self.moved_at > self.stall_s
