"""The records one engine step passes around: the scheduler's plan (prompt chunks, decoding
rows, releases, admissions), the runner's output, and each sampled token's update for the core.

Apart from engine.batch.scheduler because both sides of the step import them (the runner, the core,
the sharded ranks' channel) and none of those needs the scheduler's own state to read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mlx_serve.engine.types import FinishReason


@dataclass(frozen=True, slots=True)
class PrefillChunk:
    seq_id: str
    start: int
    end: int
    final: bool


@dataclass(frozen=True, slots=True)
class StepPlan:
    prefill: tuple[PrefillChunk, ...] = ()
    decode: tuple[str, ...] = ()
    release: tuple[str, ...] = ()
    admitted: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.prefill or self.decode or self.release)


TokenLogprobs = tuple[float, tuple[tuple[int, float], ...]]


@dataclass(frozen=True, slots=True)
class StepOutput:
    """Tokens sampled this step, by sequence: decoding rows and rows that just joined.
    A speculating row may emit several tokens in one step (a tuple, in order)."""

    tokens: dict[str, int | tuple[int, ...]] = field(default_factory=dict)
    # For rows that asked: (the token's log-probability, top (id, log-probability) pairs);
    # a list of those for a row that emitted several tokens.
    logprobs: dict[str, TokenLogprobs | list[TokenLogprobs]] = field(default_factory=dict)
    # Speculating rows: (draft tokens verified, draft tokens accepted) this step.
    speculation: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Rows whose own part of the step raised (why): the runner has dropped them; they fail alone.
    failed: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)  # not frozen: one is made per row per token, and a frozen one costs 5x to make
class TokenUpdate:
    seq_id: str
    token: int
    finish: FinishReason | None
    num_generated: int
    num_cached: int
    logprobs: TokenLogprobs | None = None
    drafted: int = 0  # this sequence's speculation so far: draft tokens verified and accepted
    accepted: int = 0
