"""Whether a step should speculate at all, and what a drafter must accept to pay for itself.

The batch-wide decision: the gate measures plain and speculative steps per batch size and picks
the faster, and the breakeven arithmetic says whether a draft model starts out as the loser.
Apart from engine.speculation.drafting, which is per row (where drafts come from): the gate knows
nothing of drafters, only of measured throughput.
"""

from __future__ import annotations

import math


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens a speculative step emits per row when each draft is accepted with this probability."""
    return float(k + 1) if acceptance >= 1 else (1 - acceptance ** (k + 1)) / (1 - acceptance)


def breakeven_acceptance(cost: float, k: int) -> float | None:
    """The acceptance at which k drafts from a drafter costing `cost` of a target step per token
    pay for themselves, even if verifying were free; None when no acceptance does."""
    need = 1 + k * cost
    if expected_tokens(1.0, k) <= need:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < need else (lo, mid)
    return hi


TYPICAL_ACCEPTANCE = 0.7  # a good draft model's acceptance on ordinary text; below its breakeven, start plain


class SpeculationGate:
    """Whether this step should speculate at all, from measured throughput per batch size.

    Speculation wins when verifying costs little more than a plain step (an accelerator reading
    weights anyway) and loses when the batch is compute-bound (a CPU, or a big batch). The gate
    keeps, per batch size (in powers of two), a moving average of tokens per second of speculative
    and of plain steps, takes the better one, and re-tries the other for `probe_len` steps after
    `probe_every` steps, then twice as long after each probe that changes nothing (a probe of a
    losing draft model is dear: its cache must catch up on every token it skipped), and never
    sooner than keeps the probes' cost within `probe_share` of the throughput.
    """

    def __init__(
        self,
        alpha: float = 0.3,
        probe_every: int = 24,
        probe_len: int = 4,
        max_interval: int = 768,
        expect_loss: bool = False,
        probe_share: float = 0.02,
    ) -> None:
        self.alpha = alpha
        # Speculation must beat plain steps by this much to be chosen: a tie (a speculating
        # policy whose rows happen to have no drafts runs plain steps) is not a reason to pay for it.
        self.margin = 1.05
        # A drafter known to cost more than it can bring (a draft model nearly as big as the
        # target): every batch size starts on plain steps and speculation is only probed.
        self.expect_loss = expect_loss
        self._mirror = [0, 4]  # joins not given a draft cache since the last one that was, the gap
        self.probe_every = probe_every
        self.probe_len = probe_len
        self.max_interval = max_interval
        self.probe_share = probe_share
        self._rate: dict[tuple[int, bool], float] = {}
        # per bucket: [steps since the last probe, probe interval, the winner at the last probe]
        self._probe: dict[int, list[int | bool]] = {}

    def choose(self, rows: int) -> bool:
        rows = rows.bit_length()  # batch sizes 1, 2-3, 4-7, 8-15, ... share what they learn
        spec, plain = self._rate.get((rows, True)), self._rate.get((rows, False))
        if spec is None and self._winning(rows):
            return True  # explore
        if plain is None:
            return False
        best = self._winning(rows)
        state = self._probe.setdefault(rows, [0, self._interval(rows, self.probe_every), best])
        if best != state[2]:  # the winner changed: probe often again
            state[0], state[1], state[2] = 0, self._interval(rows, self.probe_every), best
        state[0] += 1
        if state[0] <= state[1]:
            return best
        if state[0] >= state[1] + self.probe_len:  # probe over; the same winner probes less often
            state[0], state[1] = 0, self._interval(rows, 2 * int(state[1]))
        return not best

    def _interval(self, bucket: int, base: int) -> int:
        """Steps between probes: `base`, or more where the loser loses by much, so that probing
        costs at most `probe_share` of the throughput (a draft model verifying 16 rows on a CPU
        ran at a quarter of plain steps: probing it every 24 steps cost ~12%)."""
        spec, plain = self._rate.get((bucket, True)), self._rate.get((bucket, False))
        if spec and plain:
            loss = 1 - min(spec, plain) / max(spec, plain)
            base = max(base, math.ceil(self.probe_len * loss / self.probe_share))
        return min(base, self.max_interval)

    def mirror(self, rows: int) -> bool:
        """Should a row joining a batch of `rows` get a draft-model cache (a prefill of its prompt
        on the draft)? Where speculation wins or is unknown, yes. Where it loses, only one join in
        a growing gap (4, 8, ... 64): probes then have rows to draft for, and a losing draft
        model stops doubling every prompt's prefill."""
        if self._winning(rows.bit_length()):
            self._mirror = [0, 4]
            return True
        self._mirror[0] += 1
        if self._mirror[0] < self._mirror[1]:
            return False
        self._mirror = [0, min(2 * self._mirror[1], 64)]
        return True

    def _winning(self, bucket: int) -> bool:
        """Speculation's standing at a batch-size bucket: against plain steps (by the margin) when
        both are measured; measured with plain not yet, it stands; unmeasured, it is tried unless
        expected to lose — a draft too big to pay, or a loss at a smaller batch (verifying grows
        with the batch, so it starts out as the loser here too, and is probed like one)."""
        spec, plain = self._rate.get((bucket, True)), self._rate.get((bucket, False))
        if spec is None:
            return not (self.expect_loss or self._lost_below(bucket))
        return plain is None or spec >= self.margin * plain

    def _lost_below(self, bucket: int) -> bool:
        return any(
            self._rate.get((b, True), 0.0) < self._rate.get((b, False), 0.0)
            for b in range(1, bucket)
            if (b, True) in self._rate and (b, False) in self._rate
        )

    def record(self, rows: int, speculated: bool, tokens: int, seconds: float) -> None:
        if seconds <= 0:
            return
        rate, key = tokens / seconds, (rows.bit_length(), speculated)
        old = self._rate.get(key)
        self._rate[key] = rate if old is None else old + self.alpha * (rate - old)
