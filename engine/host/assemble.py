"""Assembling an engine core from a loaded model and settings: the memory plan, the scheduler,
runner, prefix cache and speculation, and the draft model's checks. Both hosts and every
sharded rank build their core here (engine.host.build chooses the host)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

from mlx_serve.engine.batch.core import Core
from mlx_serve.engine.host.settings import EngineSettings
from mlx_serve.engine.model.loader import LoadedModel, ModelSpec, load_model
from mlx_serve.engine.types import Counters

if TYPE_CHECKING:
    from mlx_serve.engine.batch.admission import MemoryPlan
    from mlx_serve.engine.batch.block_store import BlockStore
    from mlx_serve.engine.batch.disk_tier import DiskTier
    from mlx_serve.engine.batch.prefix_cache import PrefixCache
    from mlx_serve.engine.host.shard.group import MemoryAgreement

DEFAULT_PROMPT_CACHE_BYTES = 1 << 30
log = logging.getLogger("mlx_serve.engine")


def plan_engine_memory(
    loaded: LoadedModel, settings: EngineSettings, draft: LoadedModel | None
) -> MemoryPlan:
    """The memory plan for these settings; with no --decode-concurrency, for as many rows as it
    fits (up to 256, and as many as one step's token budget decodes at 1 + γ tokens a row)."""
    from mlx_serve.engine.batch.admission import MAX_ROWS_FROM_MEMORY, plan_memory, plan_rows
    from mlx_serve.engine.model.memory_probe import weights_bytes

    budget = settings.memory_budget_bytes
    if draft is not None and budget is not None:
        budget -= 2 * weights_bytes(draft.model)  # the draft's weights, and as much again for its KV
    draft_tokens = settings.num_draft_tokens if settings.draft_kind else 0

    def plan_for(rows: int) -> MemoryPlan:
        return plan_memory(
            loaded.model,
            budget_bytes=budget,
            prefill_step_size=settings.token_budget,
            max_context=settings.max_context,
            max_running=rows,
            draft_tokens=draft_tokens,
            kv_quantization=kv_quantization(settings),
        )

    if settings.max_running is not None:
        return plan_for(settings.max_running)
    return plan_rows(plan_for, min(MAX_ROWS_FROM_MEMORY, settings.token_budget // (1 + draft_tokens)))


def kv_quantization(settings: EngineSettings) -> tuple[int, int] | None:
    """(bits, group size) with --kv-bits, else None."""
    return None if settings.kv_bits is None else (settings.kv_bits, settings.kv_group_size)


def check_kv_quantization(loaded: LoadedModel, settings: EngineSettings) -> None:
    """--kv-bits needs every layer's cache to be a plain KV cache, and heads the group size
    divides: refused at start-up otherwise."""
    import mlx.core as mx

    from mlx_serve.engine.rows.quantized_kv import can_quantize, make_quantized_cache

    kv = kv_quantization(settings)

    if kv is None:
        return
    if not can_quantize(loaded.model):
        raise ValueError(
            "--kv-bits: this model has rotating, chunked or state caches; quantized KV is built "
            "for models whose every layer has a plain KV cache"
        )
    try:  # one token through quantized caches: a head dimension the group does not divide fails here
        mx.eval(loaded.model(mx.array([[0]]), cache=make_quantized_cache(loaded.model, *kv)))
    except ValueError as exc:
        raise ValueError(
            f"--kv-bits {settings.kv_bits} --kv-group-size {settings.kv_group_size}: "
            f"this model's attention heads cannot be quantized in groups of that size ({exc})"
        ) from exc


def make_core(
    loaded: LoadedModel,
    counters: Counters,
    settings: EngineSettings,
    draft: LoadedModel | None = None,
    shard: MemoryAgreement | None = None,
) -> Core:
    """Plan memory (raises InsufficientMemory when nothing fits), then build the core.
    `shard` (a sharded rank) makes the plan the group's and scales the prefix cache to this rank."""

    from mlx_serve.engine.batch.block_store import BlockStore
    from mlx_serve.engine.batch.runner import BatchRunner
    from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
    from mlx_serve.engine.speculation.rows import Speculation

    check_kv_quantization(loaded, settings)
    plan = plan_engine_memory(loaded, settings, draft)
    if shard is not None:
        plan = shard.agree(plan)
    log.info("%s; %d rows decoded together", plan.describe(), plan.max_running)
    sched = Scheduler(
        SchedulerConfig(
            max_running=plan.max_running,
            max_prefilling=settings.max_prefilling,
            token_budget=settings.token_budget,
            kv_capacity_tokens=plan.kv_capacity_tokens,
            draft_tokens=settings.num_draft_tokens if settings.draft_kind else 0,
            max_step_s=settings.max_step_s,
        ),
        frozenset(loaded.tokenizer.eos_token_ids),
    )
    prefix = make_prefix_cache(loaded, settings, plan, shard)
    speculation = Speculation(
        settings.draft_kind,
        settings.num_draft_tokens,
        draft.model if draft is not None else None,
        gated=settings.speculation_gated,
    )
    per_shape = builds_per_shape()
    runner = BatchRunner(
        loaded.model,
        prefill_step_size=settings.token_budget,
        prefix_cache=prefix,
        speculation=speculation,
        bucket_prefill=per_shape,
        separate_prefill=shard is not None,
        kv_quantization=kv_quantization(settings),
    )
    core = Core(sched, runner, loaded.tokenizer, counters, prefix, settings.tool_call_parser)
    core.memory_plan = plan
    if isinstance(prefix, BlockStore) and shard is None:  # ranks keep a fixed cap, evicting alike
        core.prefix_room = CacheRoom(prefix, plan)
    if isinstance(prefix, BlockStore):
        core.on_stop = prefix.close
    if settings.warmup and shard is None:  # a sharded group's ranks would have to warm up in step
        from mlx_serve.engine.host.warmup import warm_up

        core.idle_work = warm_up(loaded.model, sched.config, plan.shape.vocab, bucket_prefill=per_shape)
    return core


def make_prefix_cache(
    loaded: LoadedModel, settings: EngineSettings, plan: MemoryPlan, shard: MemoryAgreement | None
) -> PrefixCache | BlockStore | None:
    """The block store for a model of plain KV caches (the whole-entry cache, with a fixed cap,
    for others, whose caches cannot be cut into blocks); None with --prompt-cache-size 0. Unsharded, it may hold
    all the KV memory the plan has (CacheRoom gives running rows theirs first) up to
    --prompt-cache-bytes; a sharded rank keeps a fixed cap in proportion to its KV per token."""
    import mlx.core as mx

    from mlx_serve.engine.batch.block_store import BlockStore, host_reads_in_place
    from mlx_serve.engine.batch.prefix_cache import PrefixCache, gpu_min_hit
    from mlx_serve.engine.model.mlx_boundary import KVCache, make_prompt_cache

    if settings.prompt_cache_size <= 0:  # no prefix cache at all (no copy of a finished row's KV)
        return None
    if settings.kv_bits is not None:
        log.warning("prompt cache: off with --kv-bits (it stores unquantized blocks only)")
        return None
    min_hit = gpu_min_hit(mx.default_device().type == mx.DeviceType.gpu)
    if shard is not None:
        nbytes = shard.prefix_bytes(settings.prompt_cache_bytes or DEFAULT_PROMPT_CACHE_BYTES)
    else:
        whole = plan.kv_capacity_tokens * (plan.kv.per_token + plan.kv.window_per_token)
        nbytes = min(whole, settings.prompt_cache_bytes or whole)
    if not all(type(c) is KVCache for c in make_prompt_cache(loaded.model)):
        # no room given back to rows (CacheRoom is the block store's): a fixed cap
        fixed = settings.prompt_cache_bytes or DEFAULT_PROMPT_CACHE_BYTES
        nbytes = shard.prefix_bytes(fixed) if shard is not None else fixed
        return PrefixCache(max_entries=settings.prompt_cache_size, max_bytes=nbytes, min_hit=min_hit)
    disk = None if shard is not None else _disk_tier(loaded, settings)
    return BlockStore(max_bytes=nbytes, min_hit=min_hit, disk=disk, write_through=host_reads_in_place())


def _disk_tier(loaded: LoadedModel, settings: EngineSettings) -> DiskTier | None:
    from pathlib import Path

    from mlx_serve.engine.batch.block_store import BLOCK_TOKENS
    from mlx_serve.engine.batch.disk_tier import DiskTier, default_dir, fingerprint

    if settings.prompt_cache_disk_bytes <= 0:
        return None
    root = Path(settings.prompt_cache_dir) if settings.prompt_cache_dir else default_dir()
    folder = root / fingerprint(loaded.model, BLOCK_TOKENS)
    try:
        tier = DiskTier(folder, settings.prompt_cache_disk_bytes)
    except OSError as exc:
        log.warning("prompt cache: no disk tier (%s: %s)", folder, exc)
        return None
    log.info("prompt cache: disk tier %s (%d blocks, %.1f GiB)", folder, len(tier), tier.nbytes / 2**30)
    return tier


class CacheRoom:
    """Core.prefix_room for a block store: the KV memory the plan has, less the slots the
    running rows are charged for, is the store's."""

    def __init__(self, store: BlockStore, plan: MemoryPlan) -> None:
        self.store = store
        self.capacity = plan.kv_capacity_tokens
        self.slot_bytes = plan.kv.per_token + plan.kv.window_per_token

    def __call__(self, held_slots: int) -> None:
        self.store.fit(max(0, self.capacity - held_slots) * self.slot_bytes)


def builds_per_shape() -> bool:
    """Whether MLX's backend here builds a kernel for each new shape it meets, so that the
    prompt widths the engine prefills are worth keeping to a ladder (BatchRunner.bucket_prefill).
    CUDA does: even with cuDNN attention off (engine.model.backend), a prompt of a length not met
    before took 11-52 ms to prefill on the H200 and 8-13 ms the next time (1B, 200-801 tokens,
    bench/prefill_shapes.py). At exact widths prompts of every length keep meeting new shapes;
    on the ladder a server meets a few dozen widths for each count of joining rows. Metal's and
    the CPU's kernels are not built per length, so there prompts are not padded."""
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.gpu and mx.cuda.is_available()


def load_draft(target: LoadedModel, spec: ModelSpec, k: int = 3) -> LoadedModel:
    """The draft model, refused unless it shares the target's tokenizer and suits batch speculation."""
    from mlx_serve.engine.speculation.rows import draft_breakeven
    from mlx_serve.engine.speculation.verify import DraftMismatch, can_speculate

    draft = load_model(spec)
    check_draft_tokenizer(target.tokenizer, draft.tokenizer, spec.model_id)
    for name, m in (("the model", target.model), ("the draft model", draft.model)):
        if not can_speculate(m):
            raise DraftMismatch(
                f"{name} uses rotating or quantized KV caches; speculative decoding "
                "inside the batch needs plain KV caches"
            )
    log.info("draft model: %s (speculating %s)", draft.model_id, describe(draft).splitlines()[1].strip())
    cost, need, loses = draft_breakeven(target.model, draft.model, k)
    if loses:
        log.info(
            "the draft model is %.0f%% of the model's size: %d drafts a step pay off only %s; "
            "steps start plain and speculation is probed",
            100 * cost,
            k,
            "at no acceptance rate" if need is None else f"above {need:.0%} acceptance",
        )
    return draft


def check_draft_tokenizer(target: Any, draft: Any, draft_id: str) -> None:
    from mlx_serve.engine.speculation.verify import DraftMismatch

    if target.get_vocab() != draft.get_vocab():
        raise DraftMismatch(
            f"the draft model {draft_id} does not share the model's tokenizer "
            f"(vocabularies of {len(target.get_vocab())} and {len(draft.get_vocab())} "
            "tokens differ); speculative decoding needs the same token ids"
        )


def describe(loaded: LoadedModel) -> str:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from mlx_serve.engine.model.backend import device_name
    from mlx_serve.engine.model.blas import blas_in_use

    params = cast("list[tuple[str, mx.array]]", tree_flatten(loaded.model.parameters()))
    dtypes = sorted({str(v.dtype).removeprefix("mlx.core.") for _, v in params})
    nbytes = sum(v.nbytes for _, v in params)
    return (
        f"mlx-serve: engine ready: {loaded.model_id}\n"
        f"  device: {device_name()}  dtypes: {', '.join(dtypes)}  weights: {nbytes / 2**20:.0f} MiB\n"
        f"  BLAS: {blas_in_use()}"
    )
