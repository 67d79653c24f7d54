"""Rank 0: the usual core, whose runner publishes every step before running it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mlx_serve.engine.host.shard import GROUP_LOST_EXIT
from mlx_serve.engine.host.shard.channel import Admit, Channel, Message, Reset, Step, checksum
from mlx_serve.engine.host.shard.watch import print_and_exit
from mlx_serve.engine.rows.step_records import StepOutput, StepPlan
from mlx_serve.engine.types import Counters, Request

if TYPE_CHECKING:
    from mlx_serve.engine.batch.core import Core
    from mlx_serve.engine.batch.core_parts import Runner
    from mlx_serve.engine.host.settings import EngineSettings
    from mlx_serve.engine.model.loader import ModelSpec


class LeaderRunner:
    """The core's runner on rank 0: each step is first published to the followers (the rows
    admitted since the last step, the plan, the previous step's checksum), then run here."""

    def __init__(
        self,
        inner: Runner,
        channel: Channel,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.inner = inner
        self.channel = channel
        self.on_lost = on_lost or print_and_exit(GROUP_LOST_EXIT)
        self._admits: list[Admit] = []
        self._checksum: int | None = None

    def admit(
        self, request: Request, cache: list[Any] | None = None, num_cached: int = 0, constraint: Any = None
    ) -> None:
        self.inner.admit(request, cache, num_cached, constraint)
        self._admits.append(Admit(request, num_cached))

    def step(self, plan: StepPlan) -> StepOutput:
        admits, self._admits = tuple(self._admits), []
        self._publish(Step(admits, plan, self._checksum))
        self._checksum = None  # if this step fails, the next message is a Reset
        out = self.inner.step(plan)
        self._checksum = checksum(out)
        return out

    def reset(self) -> None:
        self._admits, self._checksum = [], None
        self._publish(Reset())
        self.inner.reset()

    def _publish(self, message: Message) -> None:
        try:
            self.channel.publish(message)
        except RuntimeError as exc:  # the ring noticed a lost peer before engine.host.shard.watch did
            self.on_lost(str(exc))
            raise


def load_and_build_leader(
    counters: Counters, spec: ModelSpec, settings: EngineSettings
) -> tuple[Core, dict[str, Any]]:
    """Rank 0's engine process start (engine.host.build.load_and_build with --shard)."""
    from mlx_serve.engine.host.shard.rank import start_rank

    core, channel = start_rank(counters, spec, settings)
    leader = LeaderRunner(core.runner, channel)
    core.runner = leader
    shard = {"mode": settings.shard, "size": channel.group.size()}
    return core, {"model_id": spec.model_id, "memory_plan": core.memory_plan, "shard": shard}
