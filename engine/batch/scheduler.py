"""Iteration-level continuous batching, in pure Python (no MLX).

NOTE, the algorithm. Every step: each decoding sequence gets one token; of what is left of the
step's token budget, as much as keeps the step within its measured time target
(engine.batch.step_cost) goes to prompt chunks, shared evenly over the oldest admitted sequences
whose prompt is not yet in the KV cache (at least `min_chunk` each), so a second prompt
prefills beside a long first one instead of behind it; waiting sequences are admitted FIFO while there is a prefill slot, a decode
slot and KV room for their whole prompt plus max_tokens. A sequence joins decoding the step its
last prompt chunk is computed, and leaves the step it finishes or is aborted, so nobody waits
for a batch to form and a running stream stalls by at most one chunk. A request is never
evicted for room: it waits until room frees up. How many may wait is not decided here: the
engine client's Gate bounds running plus waiting before a request is accepted (429 before any
byte), so a request the scheduler is given always runs.

Drive it as `plan = schedule()`, `out = runner.step(plan)`, `updates = update(plan, out)`
(those records: engine.rows.step_records).
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from mlx_serve.engine.batch.step_cost import StepCost, fair_shares
from mlx_serve.engine.errors import ContextTooLong, InvalidRequest
from mlx_serve.engine.rows.step_records import PrefillChunk, StepOutput, StepPlan, TokenLogprobs, TokenUpdate
from mlx_serve.engine.types import FinishReason, Request


class SeqState(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)  # compared by identity: lists of them are searched with remove()
class Sequence:
    request: Request
    order: int
    num_cached: int = 0
    num_computed: int = 0
    num_generated: int = 0
    state: SeqState = SeqState.WAITING
    drafted: int = 0
    accepted: int = 0

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_tokens)

    @property
    def kv_tokens(self) -> int:
        """KV slots this sequence may come to hold: its prompt plus every token it may write."""
        return self.prompt_len + self.request.max_tokens


@dataclass(slots=True)
class SchedulerConfig:
    max_running: int = 32
    max_prefilling: int = 8
    token_budget: int = 2048
    kv_capacity_tokens: int | None = None
    draft_tokens: int = 0  # a decoding row may verify this many draft tokens a step, on the budget
    max_step_s: float | None = None  # a step's time target beside decoding rows (StepCost); 0: none
    min_chunk: int = 256  # the least prompt tokens a prefilling row is given in a step it is given any


class Scheduler:
    """Decides, step by step, who prefills how much and who decodes. One owner thread."""

    def __init__(
        self,
        config: SchedulerConfig,
        eos_token_ids: frozenset[int],
        cached_prefix: Callable[[Request], int] | None = None,
    ) -> None:
        if config.max_running * (1 + config.draft_tokens) > config.token_budget:
            raise ValueError(
                f"max_running ({config.max_running}) × (1 + draft tokens {config.draft_tokens}) "
                f"exceeds token_budget ({config.token_budget}): decode rows alone would overrun a step"
            )
        self.config = config
        self.eos = eos_token_ids
        self.cached_prefix: Callable[[Request], int] = cached_prefix or (lambda _r: 0)
        self._orders = itertools.count()
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []
        self.decoding: list[Sequence] = []
        self._by_id: dict[str, Sequence] = {}
        self._to_release: list[str] = []
        self.kv_reserved = 0
        self.cost = StepCost(config.max_step_s, min(config.min_chunk, config.token_budget))

    # -- membership -------------------------------------------------------------------

    def add(self, request: Request) -> None:
        if not request.prompt_tokens:
            raise InvalidRequest("the prompt is empty")
        if request.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1", param="max_tokens")
        if not self.can_ever_fit(request):
            raise ContextTooLong(
                f"the prompt ({len(request.prompt_tokens)} tokens) plus max_tokens ({request.max_tokens}) "
                f"can never fit the KV budget of {self.config.kv_capacity_tokens} tokens"
            )
        seq = Sequence(request, next(self._orders))
        self.waiting.append(seq)
        self._by_id[seq.id] = seq

    def abort(self, seq_id: str) -> bool:
        """Drop a sequence in any phase. True if it was known."""
        seq = self._by_id.get(seq_id)
        if seq is None:
            return False
        self._retire(seq)
        return True

    def finish(self, seq_id: str) -> None:
        """Ended from outside (a stop string matched): free its row next step."""
        self.abort(seq_id)

    def take_releases(self) -> tuple[str, ...]:
        released, self._to_release = tuple(self._to_release), []
        return released

    def get(self, seq_id: str) -> Sequence | None:
        return self._by_id.get(seq_id)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding or self._to_release)

    @property
    def num_active(self) -> int:
        return len(self.prefilling) + len(self.decoding)

    def _retire(self, seq: Sequence) -> None:
        if seq.state is SeqState.WAITING:
            self.waiting.remove(seq)
        elif seq.state is SeqState.PREFILLING:
            self.prefilling.remove(seq)
            self._to_release.append(seq.id)
        elif seq.state is SeqState.DECODING:
            self.decoding.remove(seq)
            self._to_release.append(seq.id)
        if seq.state is not SeqState.WAITING and seq.state is not SeqState.FINISHED:
            self.kv_reserved -= seq.kv_tokens
        seq.state = SeqState.FINISHED
        self._by_id.pop(seq.id, None)

    # -- the step ---------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        release = self.take_releases()
        budget = self.config.token_budget - len(self.decoding) * (1 + self.config.draft_tokens)
        admitted = self._admit()
        budget = self.cost.prompt_budget(budget, len(self.decoding))
        needs = [seq.prompt_len - seq.num_computed for seq in self.prefilling]
        chunks = []
        for seq, n in zip(self.prefilling, fair_shares(needs, max(budget, 0), self.cost.min_chunk)):
            if n > 0:
                end = seq.num_computed + n
                chunks.append(PrefillChunk(seq.id, seq.num_computed, end, end == seq.prompt_len))
        decode = tuple(s.id for s in self.decoding)
        return StepPlan(tuple(chunks), decode, release, admitted)

    def _admit(self) -> tuple[str, ...]:
        admitted = []
        cfg = self.config
        while (
            self.waiting
            and len(self.prefilling) < cfg.max_prefilling
            and self.num_active < cfg.max_running
            and self._fits(self.waiting[0])
            and not self._leader_prefilling(self.waiting[0])
        ):
            seq = self.waiting.popleft()
            seq.state = SeqState.PREFILLING
            seq.num_cached = seq.num_computed = min(self.cached_prefix(seq.request), seq.prompt_len - 1)
            self.kv_reserved += seq.kv_tokens
            self.prefilling.append(seq)
            admitted.append(seq.id)
        return tuple(admitted)

    def _leader_prefilling(self, seq: Sequence) -> bool:
        leader = self._by_id.get(seq.request.after) if seq.request.after else None
        return leader is not None and leader.state in (SeqState.WAITING, SeqState.PREFILLING)

    def _fits(self, seq: Sequence) -> bool:
        # The batch pads every row to its longest, so what it holds is rows × the longest row.
        cap = self.config.kv_capacity_tokens
        if cap is None:
            return True
        longest = max(
            [seq.kv_tokens, *(s.kv_tokens for s in self.prefilling), *(s.kv_tokens for s in self.decoding)]
        )
        return (self.num_active + 1) * longest <= cap

    def kv_slots_held(self) -> int:
        """The KV slots the running rows are charged for (the batch pads rows to its longest)."""
        rows = (*self.prefilling, *self.decoding)
        return len(rows) * max((s.kv_tokens for s in rows), default=0)

    @property
    def releasing(self) -> bool:
        """Rows have left since the last plan and their runner rows are not yet released."""
        return bool(self._to_release)

    def can_ever_fit(self, request: Request) -> bool:
        cap = self.config.kv_capacity_tokens
        return cap is None or len(request.prompt_tokens) + request.max_tokens <= cap

    def update(self, plan: StepPlan, output: StepOutput) -> list[TokenUpdate]:
        for chunk in plan.prefill:
            seq = self._by_id.get(chunk.seq_id)
            if seq is None:
                continue
            seq.num_computed = chunk.end
            if chunk.final:
                self.prefilling.remove(seq)
                seq.state = SeqState.DECODING
                self.decoding.append(seq)
        updates = []
        by_id, logprobs, speculation = self._by_id, output.logprobs, output.speculation
        for seq_id, emitted in output.tokens.items():
            seq = by_id.get(seq_id)
            if seq is None or seq.state is not SeqState.DECODING:
                continue
            if type(emitted) is int:  # a plain step's one token (a speculative step's are a tuple)
                tokens: tuple[int, ...] = (emitted,)
            else:
                assert isinstance(emitted, tuple)
                drafted, accepted = speculation.get(seq_id, (0, 0))
                seq.drafted += drafted
                seq.accepted += accepted
                tokens = emitted
            lps = logprobs.get(seq_id) if logprobs else None
            lps_each = lps if isinstance(lps, list) else (lps,) * len(tokens)
            for token, lp in zip(tokens, lps_each):
                u = self.advance(seq, token, lp)
                updates.append(u)
                if u.finish is not None:
                    break
        return updates

    def alone(self) -> Sequence | None:
        """The one decoding sequence, when nothing else is in the scheduler: no step to plan."""
        if len(self.decoding) == 1 and not (self.waiting or self.prefilling or self._to_release):
            return self.decoding[0]
        return None

    def advance(self, seq: Sequence, token: int, lp: TokenLogprobs | None = None) -> TokenUpdate:
        """A decoding sequence's next token: its update, the sequence retired if it ends there."""
        seq.num_generated += 1
        finish = self._finish_reason(seq, token)
        update = TokenUpdate(
            seq.id, token, finish, seq.num_generated, seq.num_cached, lp, seq.drafted, seq.accepted
        )
        if finish is not None:
            self._retire(seq)
        return update

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        if token in self.eos:
            return FinishReason.STOP
        if seq.num_generated >= seq.request.max_tokens:
            return FinishReason.LENGTH
        return None
