"""A model's protocol facts, built once per loaded engine and kept on its registry slot: the
ProtocolContext (id, tokenizer, the server's defaults, context) and the validation limits."""

from __future__ import annotations

from mlx_serve.engine.errors import EngineUnavailable
from mlx_serve.engine.host.client import EngineClient
from mlx_serve.engine.types import SamplingParams
from mlx_serve.engine.validation import Limits
from mlx_serve.protocols.contract import Defaults, ProtocolContext
from mlx_serve.server.config import Config
from mlx_serve.server.registry import Slot


def protocol_context(config: Config, slot: Slot, created: int, use_model_id: bool) -> None:
    """Fill the slot's context and limits from its ready engine (EngineUnavailable while it is
    not); `use_model_id`: the model's own id (one model), else the slot's name."""
    engine = slot.engine
    model = engine.model if engine is not None else None
    if engine is None or not engine.ready or model is None:
        state = engine.state.value if engine is not None else "not loaded"
        raise EngineUnavailable(f"model is {state}; try again shortly")
    c = config
    server_sampling = SamplingParams(temperature=c.temp, top_p=c.top_p, top_k=c.top_k, min_p=c.min_p)
    defaults = Defaults(
        server_sampling,
        c.max_tokens,
        c.chat_template_args,
        c.reasoning_budget,
        c.reasoning_budget_message,
    )
    model_id = model.model_id if use_model_id else slot.name
    slot.ctx = ProtocolContext(
        model_id, model.tokenizer, defaults, created, model.context_length,
        keep_billing_header=c.keep_billing_header, facts=model.facts,
        adapter=slot.entry.adapter_path or (c.adapter_path if use_model_id else None),
    )  # fmt: skip
    slot.limits = Limits(model.tokenizer.vocab_size, model.context_length)


def engine_of(slot: Slot) -> EngineClient:
    engine = slot.engine
    if engine is None:
        raise EngineUnavailable(f"model '{slot.name}' is not loaded; try again shortly")
    return engine
