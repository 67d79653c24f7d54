"""What Ollama clients read about the models before they chat: GET /api/tags, POST /api/show,
GET /api/ps and GET /api/version.

Each is a whole answer from the request body and the protocol context, `(status, body)`, with
errors in Ollama's shape. A name without a tag is listed as `name:latest` (how Ollama spells
it) and `:latest` is accepted on any name. This server loads its model once and keeps it, so
/api/ps lists it with no expiry. Sizes are the engine's (engine.model.facts): `size` in
/api/tags the weights' files on disk, in /api/ps the memory the model holds (weights plus one
full context's KV), `size_vram` that same memory when it is a GPU's (Metal, CUDA) and 0 on a
CPU; `parameter_size` and `quantization_level` as Ollama writes them ("134.52M", "Q4_1",
"BF16"; MLX's n-bit weights "Q4"). A fact it does not know is 0 or "", the digest is the
name's.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import orjson
from msgspec import Struct

from mlx_serve.engine.errors import InvalidRequest, ServeError
from mlx_serve.engine.model.facts import ModelFacts
from mlx_serve.protocols import openai_common as common
from mlx_serve.protocols.contract import NotFound, ProtocolContext
from mlx_serve.protocols.ollama_render import created_at, error_body

# The Ollama release whose API this server follows (clients gate features on it).
OLLAMA_VERSION = "0.12.6"
ARCHITECTURE = "mlx"  # model_info's keys are "<architecture>.<fact>"; clients read context_length so
NEVER = "9999-12-31T23:59:59Z"
LATEST = ":latest"


class ShowBody(Struct, frozen=True, kw_only=True):
    model: str = ""
    name: str = ""  # the older spelling
    verbose: bool = False


SHOW_DECODER = msgspec.json.Decoder(ShowBody)


def tagged(name: str) -> str:
    return name if ":" in name.rsplit("/", 1)[-1] else name + LATEST


def _details(facts: ModelFacts | None = None) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "mlx",
        "family": ARCHITECTURE,
        "families": [ARCHITECTURE],
        "parameter_size": facts.parameter_size if facts is not None else "",
        "quantization_level": facts.quantization if facts is not None else "",
    }


def entry(name: str, facts: ModelFacts | None = None) -> dict[str, Any]:
    """A name as /api/tags lists it."""
    return {
        "name": tagged(name),
        "model": tagged(name),
        "modified_at": created_at(),
        "size": facts.file_bytes if facts is not None else 0,
        "digest": hashlib.sha256(name.encode()).hexdigest(),
        "details": _details(facts),
    }


def _names(ctx: ProtocolContext) -> list[str]:
    return list(ctx.listed) or [ctx.model_id]


def tags(body: bytes, ctx: ProtocolContext) -> tuple[int, bytes]:
    """GET /api/tags: every name the model is served under."""
    return 200, orjson.dumps({"models": [entry(n, ctx.facts) for n in _names(ctx)]})


def ps(body: bytes, ctx: ProtocolContext) -> tuple[int, bytes]:
    """GET /api/ps: the loaded model, kept for as long as the server runs."""
    return 200, orjson.dumps({"models": [loaded(ctx.model_id, ctx.facts, ctx.context_length)]})


def loaded(name: str, facts: ModelFacts | None, context_length: int | None) -> dict[str, Any]:
    """A loaded model as /api/ps lists it: the memory it holds, on a GPU or not."""
    memory = facts.memory_bytes if facts is not None else 0
    return {
        **entry(name, facts),
        "size": memory,
        "expires_at": NEVER,
        "size_vram": memory if facts is not None and facts.on_gpu else 0,
        "context_length": context_length,
    }


def version(body: bytes, ctx: ProtocolContext) -> tuple[int, bytes]:
    return 200, orjson.dumps({"version": OLLAMA_VERSION})


def show(body: bytes, ctx: ProtocolContext) -> tuple[int, bytes]:
    """POST /api/show: the template, context length and capabilities of a served name."""
    try:
        req = common.decode(SHOW_DECODER, body)
        name = req.model or req.name
        if not name:
            raise InvalidRequest("`model` is required", param="model")
        _check_name(name, ctx)
    except ServeError as exc:
        return exc.status, error_body(exc)
    template = _template(ctx)
    capabilities = ["completion", "tools"] + (["thinking"] if "<think>" in template else [])
    if ctx.dimensions is not None:
        capabilities = ["embedding"]
    info: dict[str, Any] = {
        "general.architecture": ARCHITECTURE,
        "general.basename": ctx.model_id,
        f"{ARCHITECTURE}.context_length": ctx.context_length,
    }
    if ctx.facts is not None:
        info["general.parameter_count"] = ctx.facts.parameters
    if ctx.dimensions is None:
        info[f"{ARCHITECTURE}.vocab_size"] = ctx.tokenizer.vocab_size
    else:  # an encoder's tokenizer is not mlx-lm's: its size is not asked of it
        info[f"{ARCHITECTURE}.embedding_length"] = ctx.dimensions
    out = {
        "license": "",
        "modelfile": f"# served by mlx-serve\nFROM {ctx.model_id}\n",
        "parameters": "",
        "template": template,
        "details": _details(ctx.facts),
        "model_info": info,
        "capabilities": capabilities,
        "modified_at": created_at(),
    }
    return 200, orjson.dumps(out)


def _template(ctx: ProtocolContext) -> str:
    wrapper = getattr(ctx.tokenizer, "wrapper", None)  # mlx-lm's TokenizerWrapper
    return str(getattr(wrapper, "chat_template", None) or "")


def _check_name(name: str, ctx: ProtocolContext) -> None:
    bare = name.removesuffix(LATEST)
    if ctx.accepts is not None and not ctx.accepts(bare):
        raise NotFound(f"model '{name}' not found", param="model")
