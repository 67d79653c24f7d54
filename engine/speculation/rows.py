"""Which rows of the batch speculate, with what, and whether a step should.

The server's speculation settings (`Speculation`), each row's drafter and draft length
(`RowSpeculation`, chosen when the row is admitted), the gate that lets a step speculate only at
batch sizes where that measured faster (`SpeculationGate`, fed one clean step at a time), and the
draft model's own rows. The batch runner (engine.batch.runner) owns the batch and calls these around
its steps; the verify step itself is engine.speculation.verify.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mlx_serve.engine.model.memory_probe import weights_bytes
from mlx_serve.engine.model.mlx_boundary import Model
from mlx_serve.engine.rows.row_guard import RowFaults
from mlx_serve.engine.rows.step_records import StepOutput
from mlx_serve.engine.speculation.draft_model import DraftRows
from mlx_serve.engine.speculation.drafting import (
    PREDICTION_K,
    Draft,
    PredictionLookup,
    PromptLookup,
    RowSpeculation,
)
from mlx_serve.engine.speculation.gate import TYPICAL_ACCEPTANCE, SpeculationGate, breakeven_acceptance
from mlx_serve.engine.speculation.verify import SpecBatch, can_speculate
from mlx_serve.engine.types import Request


@dataclass(frozen=True, slots=True)
class Speculation:
    """The server's speculative decoding: which drafter, and how many tokens a step drafts."""

    kind: str | None = None  # "ngram", "draft" (a draft model) or None (only per-request predictions)
    num_draft_tokens: int = 3
    draft_model: Model | None = None
    gated: bool = True  # speculate only where it measures faster (off: whenever a row has drafts)


def draft_breakeven(model: Model, draft: Model, k: int) -> tuple[float, float | None, bool]:
    """A draft model's cost per token (its share of the target's weight bytes), the acceptance
    at which k drafts pay off even with a free verify step (None: none does), and whether that
    is above what a typical acceptance brings (then the gate starts every batch size plain)."""
    cost = weights_bytes(draft) / max(weights_bytes(model), 1)
    need = breakeven_acceptance(cost, k)
    return cost, need, need is None or need > TYPICAL_ACCEPTANCE


Drafts = tuple[list[Draft | None], list[int] | None]  # per row: a lookup draft; the model's k


class SpeculatingRows:
    """The rows that may speculate, by sequence id, and the gate over them."""

    def __init__(self, model: Model, config: Speculation, prefill_step_size: int) -> None:
        self.config = config
        self._possible = can_speculate(model)
        self.rows: dict[str, RowSpeculation] = {}
        draft = config.draft_model
        loses = draft is not None and draft_breakeven(model, draft, config.num_draft_tokens)[2]
        self.gate = SpeculationGate(expect_loss=loses)
        self._last: tuple[bool, float] | None = None  # the previous clean step: the gate's call, its end
        self.draft_rows = DraftRows(draft, prefill_step_size) if draft is not None else None

    def admit(self, request: Request) -> None:
        """A prediction drafts for its own request; otherwise the server's drafter, if any.
        A request's num_draft_tokens may lower the server's γ (0 turns speculation off)."""
        row = self._choose(request)
        if row is not None:
            self.rows[request.id] = row

    def _choose(self, request: Request) -> RowSpeculation | None:
        if not self._possible or request.grammar is not None:
            return None  # a constrained row's matcher follows one token a step: it does not speculate
        conf, asked = self.config, request.num_draft_tokens
        if request.prediction:  # its draft length is the prediction's (a request may lower it)
            k = PREDICTION_K if asked is None else min(asked, PREDICTION_K)
            lookup = PredictionLookup(request.prediction, len(request.prompt_tokens))
            return RowSpeculation(lookup, k, prediction=True) if k > 0 else None
        k = conf.num_draft_tokens if asked is None else min(asked, conf.num_draft_tokens)
        if conf.kind is None or k <= 0:
            return None
        return RowSpeculation(None if conf.kind == "draft" else PromptLookup(), k)

    def forget(self, seq_id: str) -> None:
        self.rows.pop(seq_id, None)

    def allowed(self, rows: int, prefill: bool) -> bool | None:
        """Whether this step may speculate; None when no row speculates at all. Gated, a step
        that carries prefill runs plain: the joining rows' first tokens wait on it, and in a busy
        closed loop such steps are half the wall time, where the gate measures nothing (seen on
        the H200 at 16 clients)."""
        if not self.rows:
            return None
        if not self.config.gated:
            return True
        return False if prefill else self.gate.choose(rows)

    def mirrors(self, seq_id: str, rows: int) -> bool:
        """Whether the draft model follows this joining row (see SpeculationGate.mirror)."""
        row = self.rows.get(seq_id)
        if row is None or row.drafter is not None or row.k <= 0:
            return False
        return self.gate.mirror(rows) if self.config.gated else True

    def drafts(self, gen: SpecBatch, seq_of: dict[int, str], faults: RowFaults) -> Drafts | None:
        """This step's drafts per row, or None when no row drafts (a plain, pipelined step).
        A row whose drafter raises is recorded in `faults` and drafts nothing."""
        drafts: list[Draft | None] = []
        model_k: list[int] = []
        following = self.draft_rows
        for e, uid in enumerate(gen.uids):
            row = self.rows.get(seq_of[uid])
            if row is None or not row.active:
                drafts.append(None)
                model_k.append(0)
            elif row.drafter is None:
                drafts.append(None)
                model_k.append(row.k if following is not None and following.live[e] else 0)
            else:
                try:
                    d = row.drafter.draft(gen.tokens[e], gen.pending(e), row.draft_len)
                except Exception as exc:  # noqa: BLE001 - recorded and logged: the row fails alone
                    faults.record(uid, exc, "drafting")
                    d = None
                drafts.append(d if d is not None and d.tokens else None)
                model_k.append(0)
        if all(d is None for d in drafts) and max(model_k) == 0:
            return None
        return drafts, (model_k if following is not None and max(model_k) > 0 else None)

    def record(self, seq_id: str, drafted: int, accepted: int) -> bool:
        """A verify step's outcome for a row that drafted; False if the row does not speculate."""
        row = self.rows.get(seq_id)
        if not drafted or row is None:
            return False
        row.record(drafted, accepted)
        return True

    def measure(
        self, rows: int, allowed: bool | None, speculated: bool, out: StepOutput, clean: bool
    ) -> None:
        """Tokens per second of this step, for the gate, charged to the kind of step that ran.
        A step the gate let speculate but in which no row drafted ran plain, and counts as plain:
        charged to speculation it would make a drafter that had nothing to offer (a row the draft
        model was not following) look no faster than plain and keep it off for good. Only a step
        that follows one of the same kind counts: a plain step is pipelined behind the previous
        step, so the first step after a change would be charged for the other kind's forward.
        A draft model's prefill of a joining row is not charged either: it is paid once, when the
        row joins, and only where the gate has the draft follow the row (SpeculationGate.mirror);
        charged to one step's rate it made a draft model that wins lose its bucket for good."""
        if allowed is None:  # no row speculates: nothing for the gate, and no step to follow
            self._last = None
            return
        now = time.perf_counter()
        last, self._last = self._last, (speculated, now) if clean else None
        if not clean or last is None or last[0] != speculated:
            return
        emitted = sum(len(t) if isinstance(t, tuple) else 1 for t in out.tokens.values())
        self.gate.record(rows, speculated, emitted, now - last[1])


__all__ = ["Drafts", "SpeculatingRows", "Speculation", "draft_breakeven"]
