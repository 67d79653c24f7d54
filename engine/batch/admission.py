"""Memory admission: what fits is decided once at load, then each request is held to it.

NOTE, the model. Serving fits when weights + KV cache + the transient of one step ≤ the budget.
Weights and KV bytes are measured (parameter sizes; the caches of a short probe forward), the
transient is a documented estimate. KV comes in three kinds, per sequence:
  - full-attention layers: bytes for every token, forever (`kv.per_token`);
  - sliding-window layers (RotatingKVCache, ChunkedKVCache): per token until the window is
    full, then a fixed cost. Either view is an upper bound, so the KV capacity is the larger of
    "every windowed token counted" and "every window full for each of max_running sequences";
  - recurrent state (ArraysCache, SSM/conv): a fixed cost per sequence.
mlx-lm's KV caches grow in steps of 256 slots, so each sequence is also charged 255 slots.
`kv_capacity_tokens` is the aggregate prompt+max_tokens the scheduler may hold at once and
`context_limit` the most one request may ask for: min(model context, --max-context, capacity).
Since context_limit ≤ kv_capacity_tokens, a request that `admit` lets through always fits the
scheduler's budget eventually (Scheduler.can_ever_fit holds); it may wait, never evicts.
Capacity is in KV slots: mlx-lm's generation batch pads every row to its longest row, so the
slots a batch holds are rows × the longest row, not the sum of the rows' tokens.

MLX is imported inside the measuring functions only (engine.model.memory_probe, engine.model.memory_budget):
`admit` runs on the server side.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mlx_serve.engine.errors import ContextTooLong, InvalidRequest
from mlx_serve.engine.model.memory_budget import MemoryBudget, default_budget
from mlx_serve.engine.model.memory_probe import KvCost, ModelShape, probe_model, weights_bytes
from mlx_serve.engine.speculation import MIN_HOLES_TO_COMPACT as SPECULATION_MIN_HOLES

if TYPE_CHECKING:
    from mlx_serve.engine.model.mlx_boundary import Model

# Transient of one step (see _transient): float32 logits; attention scores in the activation
# dtype (MLX's portable SDPA materializes heads × chunk × context of them: measured on the CPU);
# hidden- and FFN-sized activations alive at once; all times a margin for what is left out.
LOGIT_BYTES = 4
HIDDEN_COPIES = 6
FFN_COPIES = 3
TRANSIENT_MARGIN = 1.25
# A one-token prompt and one generated token: below this, no request can ever be served.
MIN_CONTEXT_TOKENS = 2
UNBOUNDED_TOKENS = 1 << 40  # capacity when nothing grows per token (pure state-space models)


class InsufficientMemory(Exception):
    """The memory budget cannot hold the weights plus even one minimal request."""


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Decided once at load: the KV capacity for the scheduler and the context per request."""

    budget: MemoryBudget
    weights_bytes: int
    kv: KvCost
    shape: ModelShape
    prefill_step_size: int
    max_running: int
    prefill_transient_bytes: int
    kv_capacity_tokens: int
    context_limit: int

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv.per_token

    def describe(self) -> str:
        kv = f"{_fmt(self.kv.per_token)}/token"
        if self.kv.window_per_token:
            kv += f" + windows {_fmt(self.kv.window_per_token)}/token up to {_fmt(self.kv.window_full)}/sequence"
        if self.kv.per_sequence:
            kv += f" + state {_fmt(self.kv.per_sequence)}/sequence"
        model_max = f"{self.shape.max_context:,}" if self.shape.max_context else "unknown"
        total = "unbounded" if self.kv_capacity_tokens >= UNBOUNDED_TOKENS else f"{self.kv_capacity_tokens:,}"
        return (
            f"memory: budget {_fmt(self.budget.nbytes)} ({self.budget.source}) = weights "
            f"{_fmt(self.weights_bytes)} + prefill transient {_fmt(self.prefill_transient_bytes)} "
            f"({self.prefill_step_size}-token chunks) + KV {kv} → {total} tokens in all; "
            f"context {self.context_limit:,} tokens (model: {model_max})"
        )


@dataclass(frozen=True, slots=True)
class Admission:
    """One request's verdict: the max_tokens it runs with, and why if that is less than asked."""

    max_tokens: int
    requested_max_tokens: int
    context_limit: int

    @property
    def clamped(self) -> bool:
        return self.max_tokens < self.requested_max_tokens

    @property
    def warning(self) -> str | None:
        """A `Warning` header value (RFC 7234 code 299) when max_tokens was clamped."""
        if not self.clamped:
            return None
        return (
            f'299 - "max_tokens clamped from {self.requested_max_tokens} to {self.max_tokens} '
            f'to fit the {self.context_limit}-token context"'
        )


def admit(plan: MemoryPlan, prompt_tokens: int, max_tokens: int) -> Admission:
    """Clamp max_tokens to the context; raise ContextTooLong when the prompt alone cannot fit."""
    limit = plan.context_limit
    if max_tokens < 1:
        raise InvalidRequest(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    if prompt_tokens + 1 > limit:
        raise ContextTooLong(
            f"This model's maximum context length is {limit} tokens, but the prompt has "
            f"{prompt_tokens} tokens (at least {prompt_tokens + 1} are needed to generate one). "
            "Please shorten the prompt."
        )
    return Admission(min(max_tokens, limit - prompt_tokens), max_tokens, limit)


def plan_memory(
    model: Model,
    *,
    budget_bytes: int | None,
    prefill_step_size: int,
    max_context: int | None,
    max_running: int = 1,
    chunk_logits: bool = True,
    draft_tokens: int = 0,
    kv_quantization: tuple[int, int] | None = None,
) -> MemoryPlan:
    """Measure the loaded model and decide the KV capacity and context limit, or refuse.

    `chunk_logits` charges a whole prefill chunk's logits. The runner never evaluates them
    (only the cache state of a chunk is evaluated, so MLX skips the LM head); the default stays
    conservative for a runner that would (prompt logprobs, sampling from a chunk's last row).
    `draft_tokens` (a speculating server's γ) charges what a speculating row holds beyond its
    tokens: its drafts before the rejected ones are cut, and cut positions kept as masked holes
    until compaction (engine.speculation.cut_cache: at most max(32, length / 16) a row).
    `kv_quantization` (bits, group size: --kv-bits) charges the quantized KV's bytes instead.
    """
    budget = MemoryBudget(budget_bytes, "--memory-budget") if budget_bytes is not None else default_budget()
    probe = probe_model(model)
    kv, shape = probe.kv, probe.shape
    if kv_quantization is not None:
        kv = quantized_kv(kv, shape.act_bytes, *kv_quantization)
    weights = weights_bytes(model)
    fixed = weights + max_running * (kv.per_sequence + kv.step_slack)
    if draft_tokens:
        fixed += max_running * (draft_tokens + SPECULATION_MIN_HOLES) * (kv.per_token + kv.window_per_token)

    def transient(context: int) -> int:
        return _transient(
            shape, kv, min(prefill_step_size, max(context, 1)), context, max_running, chunk_logits
        )

    def capacity(context: int) -> int:
        tokens = _kv_capacity(budget.nbytes - fixed - transient(context), kv, max_running)
        return tokens * 16 // 17 if draft_tokens else tokens  # holes: up to 1/16 more slots

    caps = [c for c in (shape.max_context, max_context) if c]
    hi = min(caps) if caps else capacity(1)
    context = _largest(lambda n: capacity(n) >= n, hi)
    if context < MIN_CONTEXT_TOKENS:
        raise InsufficientMemory(
            f"the memory budget of {_fmt(budget.nbytes)} ({budget.source}) cannot serve this model: "
            f"weights take {_fmt(weights)}, a {prefill_step_size}-token prefill step "
            f"{_fmt(transient(context))}, and KV {_fmt(kv.per_token + kv.window_per_token)} per token plus "
            f"{_fmt(kv.per_sequence + kv.step_slack)} per sequence × {max_running}; that leaves room for "
            f"{context} tokens of context. Raise --memory-budget, lower --prefill-step-size or "
            "--decode-concurrency, or use a smaller or quantized model."
        )
    return MemoryPlan(
        budget,
        weights,
        kv,
        shape,
        prefill_step_size,
        max_running,
        transient(context),
        capacity(context),
        context,
    )


def quantized_kv(kv: KvCost, act_bytes: int, bits: int, group_size: int) -> KvCost:
    """The KV cost with keys and values stored as `mx.quantize` triples: `bits` per element plus
    a scale and a bias (the activation dtype) per `group_size` elements, where the probe measured
    `act_bytes` per element. Only full-attention layers are quantized (engine.rows.quantized_kv)."""
    per_element = bits * group_size + 16 * act_bytes  # in eighths of a byte per group_size elements
    scale = 8 * group_size * act_bytes
    return KvCost(
        -(-kv.per_token * per_element // scale), kv.window_per_token, kv.window_full, kv.per_sequence
    )


MAX_ROWS_FROM_MEMORY = 256  # the default decode batch's ceiling when the memory plan sizes it
ROW_SHARE_TOKENS = 4096  # the KV a row is counted for when the plan sizes the batch


def rows_that_fit(plan: MemoryPlan, cap: int = MAX_ROWS_FROM_MEMORY) -> int:
    """Rows the KV capacity holds at each row's fair share (4,096 tokens, or the context if
    less), capped. More rows than this still run (the aggregate KV budget makes a request
    wait, never evicts one); this only sizes the default batch."""
    share = max(1, min(plan.context_limit, ROW_SHARE_TOKENS))
    return max(1, min(cap, plan.kv_capacity_tokens // share))


def plan_rows(plan_for: Callable[[int], MemoryPlan], cap: int = MAX_ROWS_FROM_MEMORY) -> MemoryPlan:
    """The plan for as many rows as fit (`rows_that_fit`, ≤ cap). Every row charges fixed costs,
    so a small budget may not plan `cap` rows at all: then half as many are tried."""
    rows = cap
    while rows > 1:
        try:
            return plan_for(rows_that_fit(plan_for(rows), rows))
        except InsufficientMemory:
            rows //= 2
    return plan_for(1)


def _kv_capacity(free: int, kv: KvCost, rows: int) -> int:
    """Aggregate tokens that fit in `free` bytes; both views of windowed layers are upper bounds."""
    if free < 0:
        return 0
    every_token = kv.per_token + kv.window_per_token
    counted = free // every_token if every_token else UNBOUNDED_TOKENS
    after_windows = free - rows * kv.window_full
    if after_windows < 0:
        return counted
    return max(counted, after_windows // kv.per_token if kv.per_token else UNBOUNDED_TOKENS)


def _transient(shape: ModelShape, kv: KvCost, chunk: int, context: int, rows: int, chunk_logits: bool) -> int:
    """Peak scratch of one step: a prefill chunk (its logits, activations, one layer's attention
    scores, a sliding window's overshoot by one chunk) plus the decode rows' logits and sampling."""
    logits = (chunk * chunk_logits + 2 * rows) * shape.vocab * LOGIT_BYTES
    acts = chunk * (HIDDEN_COPIES * shape.hidden + FFN_COPIES * shape.intermediate) * shape.act_bytes
    attends = kv.per_token or kv.window_per_token  # a pure state-space model has no scores
    scores = shape.heads * chunk * context * shape.act_bytes if attends else 0
    return math.ceil(TRANSIENT_MARGIN * (logits + acts + scores + chunk * kv.window_per_token))


def _largest(fits: Callable[[int], bool], hi: int) -> int:
    """The largest n in [0, hi] with fits(n), for a predicate that holds up to some point."""
    lo = 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
