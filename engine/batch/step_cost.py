"""What a step costs, measured, and how many prompt tokens a step may carry beside decoding rows.

A prompt chunk rides in the same step as every decoding row's next token, so a long chunk is a
long gap in every stream. The core reports each step's wall time (`observe`); from steps with
and without prompt tokens this keeps two running estimates — a decode step's time and a prompt
token's time — and sizes the prompt part of a step so the whole step stays within a target:
`max_step_s` when the operator set one (`--max-step-ms`), else `DECODE_STEP_MULTIPLE` times a
decode step (streams' gaps stay within that multiple of their usual gap while a prompt
prefills). A step never carries fewer than `min_chunk` prompt tokens: chunks much smaller than
that cost more per token on every backend, and a long prompt must still make progress. Until both
estimates exist (a step with prompt tokens and one without, beside decoding rows) and with no row
decoding, the whole token budget goes to prompts.

Pure Python (the scheduler's side of the step): unit-tested with made-up timings.
"""

from __future__ import annotations

from dataclasses import dataclass

DECODE_STEP_MULTIPLE = 2.5
SMOOTHING = 0.2  # weight of the newest step in each running estimate


@dataclass(slots=True)
class StepCost:
    max_step_s: float | None = None  # None: DECODE_STEP_MULTIPLE × the measured decode step; 0: off
    min_chunk: int = 256
    decode_s: float | None = None  # a step with decoding rows and no prompt tokens
    token_s: float | None = None  # one prompt token's share of a step that carried some

    def observe(self, prompt_tokens: int, decode_rows: int, seconds: float) -> None:
        """One finished step: how many prompt tokens and decoding rows it carried, its wall time."""
        if prompt_tokens == 0:
            if decode_rows:
                self.decode_s = _mix(self.decode_s, seconds)
            return
        decode = self.decode_s if decode_rows and self.decode_s is not None else 0.0
        self.token_s = _mix(self.token_s, max(seconds - decode, 0.0) / prompt_tokens)

    def prompt_budget(self, budget: int, decode_rows: int) -> int:
        """Prompt tokens the next step may carry, of the `budget` left after decoding rows."""
        if decode_rows == 0 or self.max_step_s == 0 or self.decode_s is None or self.token_s is None:
            return budget
        target = self.max_step_s if self.max_step_s is not None else DECODE_STEP_MULTIPLE * self.decode_s
        fits = int((target - self.decode_s) / self.token_s + 1e-6) if self.token_s > 0 else budget
        return min(budget, max(self.min_chunk, fits))


def _mix(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


def fair_shares(needs: list[int], budget: int, min_chunk: int) -> list[int]:
    """Split `budget` prompt tokens over rows needing `needs` (oldest first): as many of the
    oldest rows as can each have `min_chunk` share it evenly, a row that needs less than its
    share leaving the rest to the others; what is still left goes to the next rows in order, so
    no budget is left unused while a prompt waits for it."""
    shares = [0] * len(needs)
    if not needs:
        return shares
    k = max(1, min(len(needs), budget // max(min_chunk, 1)))
    left = budget
    for rank, i in enumerate(sorted(range(k), key=lambda i: needs[i])):
        shares[i] = min(needs[i], left // (k - rank))
        left -= shares[i]
    for i in range(len(needs)):
        more = min(needs[i] - shares[i], left)
        shares[i] += more
        left -= more
    return shares
