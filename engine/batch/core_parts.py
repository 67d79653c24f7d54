"""What the engine core is given and what it keeps a request by: the runner, prefix-lookup and
idle-work seams it is built with (engine.batch.core.Core), a submitted request's ticket (the way back to
its consumer) and its engine-side clock."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from mlx_serve.engine.errors import ServeError
from mlx_serve.engine.types import Emitted, EngineTimings, Request

if TYPE_CHECKING:
    from mlx_serve.engine.batch.prefix_cache import Found
    from mlx_serve.engine.model.mlx_boundary import CacheLayer, LogitsProcessor
    from mlx_serve.engine.rows.step_records import StepOutput, StepPlan


class PrefixLookup(Protocol):
    def lookup(self, tokens: tuple[int, ...]) -> tuple[list[CacheLayer] | None, int]: ...

    @property
    def last(self) -> Found:
        """The last lookup's whole answer (its disk share and miss kind too)."""
        ...


class Runner(Protocol):
    def admit(
        self,
        request: Request,
        cache: list[CacheLayer] | None = None,
        num_cached: int = 0,
        constraint: LogitsProcessor | None = None,
    ) -> None: ...
    def step(self, plan: StepPlan) -> StepOutput: ...
    def reset(self) -> None: ...


@runtime_checkable
class PrefixHolding(Protocol):
    """A prefix cache that says what it holds (the block store, the whole-entry cache): /stats' gauges."""

    @property
    def nbytes(self) -> int: ...

    def __len__(self) -> int: ...


@runtime_checkable
class LoneRunner(Protocol):
    """A runner that can step one plain row without a plan (BatchRunner; see Core._step_alone)."""

    def alone(self, seq_id: str) -> bool: ...
    def step_alone(self) -> int: ...
    def take_failed(self) -> dict[str, str]: ...


class IdleWork(Protocol):
    """Work the engine does only while no request is in it (the GPU warm-up's larger batches)."""

    def step(self) -> bool:
        """Run one unit, a batch step at most; False once nothing is left."""
        ...

    def pause(self) -> None:
        """A request has arrived: drop what the part under way holds (its KV cache); the
        next step() starts that part again."""
        ...


@dataclass(slots=True)
class Ticket:
    """A submitted request and the way back to its consumer."""

    request: Request
    emit: Callable[[Emitted | ServeError], None]
    aborted: threading.Event = field(default_factory=threading.Event)
    # Admitted to a row (running, not waiting): set on the step loop, read by a stats answer
    # given off it (engine.host.process_child), so the counts are live during a long step.
    started: bool = False
    constraint: Any = None  # its grammar compiled off the step loop (a rows.grammar.Constraint), or None


@dataclass(slots=True)
class Clock:
    """One sequence's engine-side timestamps (perf_counter seconds)."""

    accepted: float
    admitted: float | None = None
    first_token: float | None = None
    first_delta: float | None = None
    chunks: list[tuple[int, float]] = field(default_factory=list)

    def timings(self, now: float) -> EngineTimings:
        def since(t: float | None) -> float | None:
            return None if t is None else round(t - self.accepted, 6)

        return EngineTimings(
            since(self.admitted) or 0.0,
            tuple(self.chunks),
            since(self.first_token),
            round(now - self.accepted, 6),
            self.accepted,
            since(self.first_delta),
        )
