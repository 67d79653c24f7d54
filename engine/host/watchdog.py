"""The engine watchdog: an engine that holds work but neither answers nor steps is not healthy.

While requests are in flight the host asks its engine, every tick, how many steps it has run
(`engine_steps`, answered by the child's reader thread, not the stepping one). Two limits:

- the child has answered nothing for `stall_s` (a stopped or wedged process: SIGSTOP, a
  reader that cannot get the GIL back);
- it answers, but its step count has not moved for STEP_LIMIT_FACTOR × `stall_s` (a step that
  never ends). One prefill chunk of 2,048 tokens can take longer than `stall_s` on a loaded CPU:
  a slow step is not a hang, so this limit is ten times the first.

Past either, the engine is declared not responding: /health says 503 "engine not responding",
in-flight streams get an error frame instead of pausing silently, new requests get 503, and,
unless told otherwise, the engine process is killed and restarted. One that moves again is
healthy again.
"""

from __future__ import annotations

from dataclasses import dataclass

STALL_S = 30.0  # no answer for this long while work is in flight: not responding
STEP_LIMIT_FACTOR = 10  # answering, but no step for this many times stall_s: not responding
TICK_S = 1.0


@dataclass(slots=True)
class Progress:
    """What the watchdog has seen of the engine: its step count, when it last moved and last
    answered."""

    stall_s: float = STALL_S
    steps: int = -1
    moved_at: float = 0.0
    answered_at: float = 0.0
    busy: bool = False

    def idle(self, now: float) -> None:
        """No work in flight: nothing can be late."""
        self.busy, self.moved_at, self.answered_at = False, now, now

    def saw(self, steps: int, now: float) -> None:
        """The engine's step count, as it answered."""
        self.answered_at = now
        if steps != self.steps:
            self.steps, self.moved_at = steps, now

    def moved(self, now: float) -> None:
        """Events came: the engine stepped."""
        self.moved_at = self.answered_at = now

    def working(self, now: float) -> None:
        if not self.busy:  # work just arrived: the stall clocks start now
            self.busy, self.moved_at, self.answered_at = True, now, now

    def stalled(self, now: float) -> str | None:
        """Why the engine is not responding, or None."""
        if self.stall_s <= 0 or not self.busy:
            return None
        if now - self.answered_at > self.stall_s:
            return f"no answer in {self.stall_s:g} s"
        if now - self.moved_at > STEP_LIMIT_FACTOR * self.stall_s:
            return f"no step completed in {STEP_LIMIT_FACTOR * self.stall_s:g} s"
        return None
