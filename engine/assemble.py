"""Putting an engine together from settings: scheduler, runner, prefix cache, core."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core import Core
from engine.loader import LoadedModel, ModelSpec, load_model
from engine.types import Counters

DEFAULT_PROMPT_CACHE_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The engine's knobs, picklable so a child process can rebuild the same engine."""

    max_running: int = 32
    max_prefilling: int = 8
    token_budget: int = 2048
    max_waiting: int = 64
    prompt_cache_size: int = 10
    prompt_cache_bytes: int | None = None
    seed: int | None = None
    memory_budget_bytes: int | None = None
    max_context: int | None = None
    tool_call_parser: str | None = None  # a tool_formats family name; None: inferred

    @property
    def capacity(self) -> int:
        """Calls that may be in flight at once: running rows plus the waiting queue."""
        return self.max_running + self.max_waiting


def make_core(loaded: LoadedModel, counters: Counters, settings: EngineSettings,
              adapter_path: str | None = None) -> Core:
    """Plan memory (raises InsufficientMemory when nothing fits), then build the core."""
    from engine.admission import plan_memory
    from engine.prefix_cache import PrefixCache
    from engine.runner import BatchRunner
    from engine.scheduler import Scheduler, SchedulerConfig

    plan = plan_memory(loaded.model, budget_bytes=settings.memory_budget_bytes,
                       prefill_step_size=settings.token_budget, max_context=settings.max_context,
                       max_running=settings.max_running)
    print(plan.describe(), flush=True)
    sched = Scheduler(SchedulerConfig(max_running=settings.max_running,
                                      max_prefilling=settings.max_prefilling,
                                      token_budget=settings.token_budget,
                                      max_waiting=settings.max_waiting,
                                      kv_capacity_tokens=plan.kv_capacity_tokens),
                      frozenset(loaded.tokenizer.eos_token_ids))
    prefix = PrefixCache(f"{loaded.model_id}|{adapter_path or ''}",
                         max_entries=settings.prompt_cache_size,
                         max_bytes=settings.prompt_cache_bytes or DEFAULT_PROMPT_CACHE_BYTES)
    runner = BatchRunner(loaded.model, prefill_step_size=settings.token_budget, prefix_cache=prefix)
    core = Core(sched, runner, loaded.tokenizer, counters, prefix, settings.tool_call_parser)
    core.memory_plan = plan
    return core


def load_and_build(counters: Counters, spec: ModelSpec, settings: EngineSettings
                   ) -> tuple[Core, dict[str, Any]]:
    """The engine process's whole start: load weights, build the core, describe the setup."""
    import mlx.core as mx

    if settings.seed is not None:
        mx.random.seed(settings.seed)
    loaded = load_model(spec)
    print(describe(loaded), flush=True)
    core = make_core(loaded, counters, settings, spec.adapter_path)
    return core, {"model_id": loaded.model_id, "memory_plan": core.memory_plan}


def describe(loaded: LoadedModel) -> str:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from engine.blas import blas_in_use

    params = tree_flatten(loaded.model.parameters())
    dtypes = sorted({str(v.dtype).removeprefix("mlx.core.") for _, v in params})
    nbytes = sum(v.nbytes for _, v in params)
    return (f"mlx-serve: engine ready: {loaded.model_id}\n"
            f"  device: {mx.default_device()}  dtypes: {', '.join(dtypes)}  weights: {nbytes / 2**20:.0f} MiB\n"
            f"  BLAS: {blas_in_use()}")
