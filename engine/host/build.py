"""Putting an engine together from settings: `build()` gives the server its EngineClient,
hosted in a thread or a child process; the core inside is assembled by engine.host.assemble.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial
from typing import Any

from mlx_serve.engine.batch.core import Core
from mlx_serve.engine.host.assemble import describe, load_draft, make_core
from mlx_serve.engine.host.client import EngineClient
from mlx_serve.engine.host.settings import EngineSettings, ModelSource
from mlx_serve.engine.model.facts import model_facts
from mlx_serve.engine.model.loader import LoadedModel, ModelSpec, load_model
from mlx_serve.engine.types import Counters

log = logging.getLogger("mlx_serve.engine")


def prepare_process(blas: str, computes_here: bool = True) -> None:
    """Before MLX is imported: the attention choice, then the BLAS, which re-executes this process
    when it computes (`computes_here`), else is set for the engine processes it starts."""
    from mlx_serve.engine.model.backend import prefer_shape_free_attention
    from mlx_serve.engine.model.blas import preload_for_children, reexec_with_blas

    prefer_shape_free_attention()  # before the BLAS re-exec, which passes the environment on
    if computes_here:
        reexec_with_blas(blas)
    else:
        preload_for_children(blas)


def tool_call_parsers() -> list[str]:
    """The tool-call markup families --tool-call-parser may name."""
    from mlx_serve.engine.tools.formats import parser_names

    return list(parser_names())


def build(settings: EngineSettings, source: ModelSource) -> EngineClient:
    """The engine the server talks to: nothing is loaded until its `start()`."""
    from dataclasses import replace

    from mlx_serve.engine.encoder.loader import is_encoder, load_encoder
    from mlx_serve.engine.host.spare import discard_spare

    if source.model is not None and is_encoder(source.model):  # an embedding model: no KV, no rows
        discard_spare()  # its process is the encoder's own
        from mlx_serve.engine.host.encoder import EncoderEngine
        from mlx_serve.engine.host.encoder_process import EncoderProcessEngine

        waiting = settings.max_waiting * 256
        if source.host == "thread":
            return EncoderEngine(partial(load_encoder, source.model), max_waiting_inputs=waiting)
        return EncoderProcessEngine(source.model, max_waiting_inputs=waiting)

    from mlx_serve.engine.host.child import ChildPlan
    from mlx_serve.engine.host.process import ProcessEngine
    from mlx_serve.engine.host.thread import ThreadEngine

    settings = replace(settings, draft_spec=source.draft_spec())
    if settings.shard is not None and source.host == "thread":
        raise ValueError(
            "a sharded engine runs in its own process (engine.host.shard); --engine thread cannot"
        )
    if source.host == "thread":
        discard_spare()
        specs: list[ModelSpec] = []  # resolved on the engine thread, like the weights

        def load() -> LoadedModel:
            specs.append(source.model_spec())
            return load_model(specs[0])

        def make(loaded: LoadedModel, counters: Counters) -> Core:
            draft = load_draft(loaded, settings.draft_spec) if settings.draft_spec is not None else None
            return make_core(loaded, counters, settings, draft)

        return ThreadEngine(load, make, capacity=settings.capacity, waiting=settings.max_waiting)

    def prepare() -> ChildPlan:
        from mlx_serve.engine.model.loader import load_tokenizer

        spec = source.model_spec()
        return ChildPlan(spec.model_id, load_and_build, (spec, settings), lambda: load_tokenizer(spec))

    return ProcessEngine(
        prepare,
        capacity=settings.capacity,
        waiting=settings.max_waiting,
        restartable=settings.shard is None,
        stall_s=settings.stall_s,
        restart_stalled=settings.restart_stalled,
    )


def load_and_build(
    counters: Counters, spec: ModelSpec, settings: EngineSettings
) -> tuple[Core, dict[str, Any]]:
    """The engine process's whole start: load weights, build the core, describe the setup."""
    import mlx.core as mx

    if settings.shard is not None:
        from mlx_serve.engine.host.shard.leader import load_and_build_leader

        return load_and_build_leader(counters, spec, settings)

    if settings.seed is not None:
        mx.random.seed(settings.seed)
    loaded = load_model(spec)
    log.info("%s", describe(loaded))
    draft = (
        load_draft(loaded, settings.draft_spec, settings.num_draft_tokens)
        if settings.draft_spec is not None
        else None
    )
    core = make_core(loaded, counters, settings, draft)
    facts = model_facts(loaded.path)
    if facts is not None:
        facts = replace(facts, on_gpu=mx.default_device().type == mx.DeviceType.gpu)
    return core, {"model_id": loaded.model_id, "memory_plan": core.memory_plan, "facts": facts}
