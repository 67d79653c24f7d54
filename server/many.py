"""A many-model server's registry from its flags: the entries (server.models_file), each one's
engine settings (the server's flags, overridden by the entry's own), the memory budget shared
across them, and each model's memory need from its files (engine.model.fit)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from mlx_serve.server.config import Config
from mlx_serve.server.models_file import ModelEntry, all_entries

if TYPE_CHECKING:
    from mlx_serve.engine.host.client import EngineClient
    from mlx_serve.server.budget import Need
    from mlx_serve.server.registry import Registry

# The context a model's memory need counts KV for when neither the entry nor the model says less:
# a load is admitted when its weights and one context of this many tokens fit.
PLANNED_CONTEXT = 8192


def is_many(config: Config) -> bool:
    return bool(config.models_file or config.named_models or config.adapters)


def model_entries(config: Config) -> list[ModelEntry]:
    c = config
    return all_entries(c.models_file, c.model, c.served_model_name, c.named_models, c.adapters, c.pin)


def entry_config(config: Config, entry: ModelEntry, budget_bytes: int | None) -> Config:
    """The server's settings for one model's engine: the entry's own where it gives them."""
    draft_kind = "draft" if entry.draft_model else ("ngram" if config.draft_kind == "ngram" else None)
    return replace(
        config,
        model=entry.source,
        adapter_path=entry.adapter_path,
        draft_model=entry.draft_model,
        draft_kind=draft_kind,
        tool_call_parser=entry.tool_call_parser or config.tool_call_parser,
        chat_template=entry.chat_template or config.chat_template,
        max_context=entry.max_context or config.max_context,
        decode_concurrency=entry.decode_concurrency or config.decode_concurrency,
        memory_budget_bytes=budget_bytes,
    )


def model_path(source: str | None) -> Path | None:
    """The file or folder a source names when it is here already (None: fetched at load)."""
    from mlx_serve.engine.model.loader import SHORTCUTS, cache_root, default_gguf

    if source is None:
        return default_gguf()
    if source.lower() in SHORTCUTS:
        return cache_root() / "models" / SHORTCUTS[source.lower()].gguf.file_name
    return Path(source).expanduser()


def estimate(config: Config, entry: ModelEntry) -> Need | None:
    """A model's memory need from its files: weights as served, KV for its planned context."""
    import mlx.core as mx

    from mlx_serve.engine.model import fit
    from mlx_serve.server.budget import Need

    path = model_path(entry.source)
    float32 = mx.default_device() == mx.cpu and config.dequantize != "never"
    if path is not None and path.suffix == ".gguf" and path.is_file():
        facts = fit.fit_gguf(path, 0, float32)
    elif path is not None and (path / "config.json").is_file():
        facts = fit.fit_folder(path, 0, float32)
    else:
        return None
    limit = entry.max_context or config.max_context or PLANNED_CONTEXT
    context = min(limit, facts.max_position) if facts.max_position else limit
    return Need(facts.weights_bytes, facts.kv_bytes_per_token, context, facts.max_position)


def build_registry(config: Config, build_engine: Callable[[Config], EngineClient]) -> Registry:
    """Every model of the flags, none loaded yet (the registry loads the default and the pinned
    ones at start); the budget is --memory-budget or the machine's default share."""
    from mlx_serve.engine.model.memory_budget import default_budget
    from mlx_serve.server.registry import Registry, Slot

    budget = config.memory_budget_bytes or default_budget().nbytes

    def make(entry: ModelEntry, share: int | None) -> EngineClient:
        return build_engine(entry_config(config, entry, share))

    slots = [Slot(e) for e in model_entries(config)]
    return Registry(slots, make, budget, lambda e: estimate(config, e), config.idle_unload_s)
