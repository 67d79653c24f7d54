"""Rank 0: the usual core, whose runner publishes every step before running it."""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.scheduler import StepOutput, StepPlan
from engine.shard import GROUP_LOST_EXIT
from engine.shard.channel import Admit, Channel, Message, Reset, Step, Tick, checksum
from engine.types import Counters, Request

if TYPE_CHECKING:
    from engine.build import EngineSettings
    from engine.core import Core, Runner
    from engine.loader import ModelSpec

log = logging.getLogger("mlx_serve.shard")

TICK_S = 1.0  # while idle, how often rank 0 checks that the group is whole


def exit_group_lost(reason: str) -> None:
    """A rank is gone and collectives can never pair up again: end this engine process (the
    server reports it and does not restart a sharded engine)."""
    print(f"mlx-serve: the sharded group lost a rank: {reason}", file=sys.stderr, flush=True)
    os._exit(GROUP_LOST_EXIT)


class LeaderRunner:
    """The core's runner on rank 0: each step is first published to the followers (the rows
    admitted since the last step, the plan, the previous step's checksum), then run here."""

    def __init__(
        self, inner: Runner, channel: Channel, on_lost: Callable[[str], None] = exit_group_lost
    ) -> None:
        self.inner = inner
        self.channel = channel
        self.on_lost = on_lost
        self._admits: list[Admit] = []
        self._checksum: int | None = None
        self._sent_at = time.monotonic()

    def admit(
        self, request: Request, cache: list[Any] | None = None, num_cached: int = 0, constraint: Any = None
    ) -> None:
        self.inner.admit(request, cache, num_cached, constraint)
        self._admits.append(Admit(request, num_cached))

    def step(self, plan: StepPlan) -> StepOutput:
        admits, self._admits = tuple(self._admits), []
        self._publish(Step(admits, plan, self._checksum))
        try:
            out = self.inner.step(plan)
        except Exception:
            # A lost rank fails the step's collectives: say so rather than fail the rows and go on.
            self._checksum = None
            self._publish(Tick())
            raise
        self._checksum = checksum(out)
        return out

    def reset(self) -> None:
        self._admits, self._checksum = [], None
        self._publish(Reset())
        self.inner.reset()

    def idle(self) -> None:
        """Called by the core while it waits for work."""
        if time.monotonic() - self._sent_at >= TICK_S:
            self._publish(Tick())

    def _publish(self, message: Message) -> None:
        try:
            self.channel.publish(message)
        except RuntimeError as exc:
            self.on_lost(str(exc))
            raise
        self._sent_at = time.monotonic()


def load_and_build_leader(
    counters: Counters, spec: ModelSpec, settings: EngineSettings
) -> tuple[Core, dict[str, Any]]:
    """Rank 0's engine process start (engine.build.load_and_build with --shard)."""
    from engine.shard.rank import start_rank

    core, channel = start_rank(counters, spec, settings)
    leader = LeaderRunner(core.runner, channel)
    core.runner = leader
    core.on_idle = leader.idle
    shard = {"mode": settings.shard, "size": channel.group.size()}
    return core, {"model_id": spec.model_id, "memory_plan": core.memory_plan, "shard": shard}
