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

MLX is imported inside the measuring functions only: `admit` runs on the server side.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from engine.errors import ContextTooLong, InvalidRequest

if TYPE_CHECKING:  # MLX itself is imported where it is measured (see the module note)
    import mlx.core as mx

    from engine.mlx_boundary import Model

# Leaves 30% of RAM to the OS, the server process, MLX's buffer cache and fragmentation.
CPU_RAM_FRACTION = 0.7
# Metal's recommended working set (or CUDA's memory) is already a device ceiling: keep 10% spare
# for allocator fragmentation and cached buffers.
GPU_MEMORY_FRACTION = 0.9
CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
KV_ALLOC_STEP = 256  # mlx_lm.models.cache.KVCache.step
SPECULATION_MIN_HOLES = (
    32  # engine.speculation.cut_cache compacts a batch once a row holds this many cut positions
)
PROBE_TOKENS = 4
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
MAX_CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "context_length",
    "n_ctx",
)


class InsufficientMemory(Exception):
    """The memory budget cannot hold the weights plus even one minimal request."""


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    nbytes: int
    source: str  # how it was chosen, for the startup banner


@dataclass(frozen=True, slots=True)
class KvCost:
    """KV bytes of one sequence, split by how they grow (see the module NOTE)."""

    per_token: int = 0
    window_per_token: int = 0
    window_full: int = 0
    per_sequence: int = 0

    def __add__(self, other: KvCost) -> KvCost:
        return KvCost(
            self.per_token + other.per_token,
            self.window_per_token + other.window_per_token,
            self.window_full + other.window_full,
            self.per_sequence + other.per_sequence,
        )

    @property
    def step_slack(self) -> int:
        return (KV_ALLOC_STEP - 1) * (self.per_token + self.window_per_token)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the transient estimate needs; vocab and activation dtype come from the probe."""

    hidden: int
    intermediate: int
    heads: int
    vocab: int
    act_bytes: int
    max_context: int | None


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
) -> MemoryPlan:
    """Measure the loaded model and decide the KV capacity and context limit, or refuse.

    `chunk_logits` charges a whole prefill chunk's logits. The runner never evaluates them
    (only the cache state of a chunk is evaluated, so MLX skips the LM head); the default stays
    conservative for a runner that would (prompt logprobs, sampling from a chunk's last row).
    `draft_tokens` (a speculating server's γ) charges what a speculating row holds beyond its
    tokens: its drafts before the rejected ones are cut, and cut positions kept as masked holes
    until compaction (engine.speculation.cut_cache: at most max(32, length / 16) a row).
    """
    budget = MemoryBudget(budget_bytes, "--memory-budget") if budget_bytes is not None else default_budget()
    probe = _probe(model)
    kv, shape = probe.kv, probe.shape
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


# -- measuring ------------------------------------------------------------------------


def weights_bytes(model: Model) -> int:
    """Bytes of every parameter as stored (quantized weights count their packed size)."""
    return sum(a.nbytes for a in _arrays(model.parameters()))


@dataclass(frozen=True, slots=True)
class Probe:
    kv: KvCost
    shape: ModelShape


def _probe(model: Model) -> Probe:
    """A few tokens through a fresh cache: the caches' shapes and dtypes give the KV cost."""
    import mlx.core as mx

    from engine.mlx_boundary import make_prompt_cache

    # Never evaluated: MLX knows the shapes and dtypes of the lazy graph, so the probe costs no
    # forward pass (and no memory) even for a large model on a CPU.
    cache = make_prompt_cache(model)
    logits = model(mx.arange(PROBE_TOKENS)[None], cache=cache)
    kv = sum((_layer_cost(c) for c in cache), KvCost())
    return Probe(kv, _shape(model, logits.shape[-1], logits.dtype.size))


def _layer_cost(c: Any) -> KvCost:  # a layer of any kind, read by what it has
    from engine import mlx_boundary as mc

    if isinstance(c, mc.CacheList):
        return sum((_layer_cost(x) for x in c.caches), KvCost())
    if isinstance(c, mc.ArraysCache) or not hasattr(c, "keys"):
        return KvCost(per_sequence=sum(a.nbytes for a in _arrays(c.state)))
    per_token = _bytes_per_slot(c.keys) + _bytes_per_slot(c.values)
    if isinstance(c, mc.RotatingKVCache | mc.BatchRotatingKVCache):
        return KvCost(window_per_token=per_token, window_full=c.max_size * per_token)
    if isinstance(c, mc.ChunkedKVCache):
        return KvCost(window_per_token=per_token, window_full=(c.chunk_size + KV_ALLOC_STEP) * per_token)
    return KvCost(per_token=per_token)


def _bytes_per_slot(x: object) -> int:
    # Keys/values are (batch=1, heads, slots, dim), or a tuple of such for quantized caches;
    # dividing by the allocated slots skips the 256-slot preallocation.
    return sum(a.nbytes // a.shape[-2] for a in _arrays(x) if a.ndim >= 2)


def _arrays(tree: object) -> list[mx.array]:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    flat = cast("list[tuple[str, object]]", tree_flatten(tree, destination=[]))
    return [a for _, a in flat if isinstance(a, mx.array)]


def _shape(model: Model, vocab: int, act_bytes: int) -> ModelShape:
    hidden = _arg(model, "hidden_size", "d_model", "n_embd", "dim") or 8192
    inter = max(
        _arg(model, "intermediate_size", "ffn_dim", "n_inner", "hidden_dim") or 4 * hidden,
        (_arg(model, "moe_intermediate_size") or 0) * (_arg(model, "num_experts_per_tok") or 1),
    )
    heads = _arg(model, "num_attention_heads", "n_heads", "n_head", "num_heads") or 64
    return ModelShape(hidden, inter, heads, vocab, act_bytes, _arg(model, *MAX_CONTEXT_KEYS))


def _arg(model: Model, *names: str) -> int | None:
    """The first positive integer setting by these names in the model's args (or text_config)."""
    args = getattr(model, "args", None)
    text = getattr(args, "text_config", None)
    for source in (args, text):
        for name in names:
            value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
            if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
                value = max(value)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


# -- the budget -------------------------------------------------------------------------


def default_budget() -> MemoryBudget:
    """A safe share of what the default device can hold (see the *_FRACTION constants)."""
    import mlx.core as mx

    if mx.default_device().type == mx.DeviceType.gpu:
        info = mx.device_info()
        working_set = info.get("max_recommended_working_set_size")
        if isinstance(working_set, int) and working_set > 0:
            return MemoryBudget(
                int(GPU_MEMORY_FRACTION * working_set),
                f"{GPU_MEMORY_FRACTION:.0%} of Metal's recommended working set",
            )
        total, free = info.get("total_memory"), info.get("free_memory")
        if isinstance(total, int) and total > 0:
            # A shared GPU: what is free now plus what this process already holds.
            ours = mx.get_active_memory() + mx.get_cache_memory()
            usable = min(total, free + ours) if isinstance(free, int) else total
            return MemoryBudget(int(GPU_MEMORY_FRACTION * usable), f"{GPU_MEMORY_FRACTION:.0%} of GPU memory")
    return MemoryBudget(int(CPU_RAM_FRACTION * total_ram_bytes()), f"{CPU_RAM_FRACTION:.0%} of RAM")


def total_ram_bytes() -> int:
    """Physical RAM, or the container's memory limit when that is lower."""
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for name in CGROUP_LIMIT_FILES:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            ram = min(ram, int(text))
    return ram


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
