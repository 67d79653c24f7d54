"""Ollama's embeddings: POST /api/embed (`input`: a string or strings → `embeddings`) and the
older POST /api/embeddings (`prompt` → `embedding`), on the engine's embed() as /v1/embeddings.

On a generation model the engine refuses with a 400 naming the model. `options` and
`keep_alive` change nothing here and are named in a `Warning`; an input longer than the model's
context is a 400 rather than cut (Ollama's `truncate`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
import orjson
from msgspec import Meta, Struct

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.host.client import Embeddings
from mlx_serve.protocols import conversation as conv
from mlx_serve.protocols import openai_common as common
from mlx_serve.protocols.ollama_render import NANOS
from mlx_serve.protocols.openai_embeddings import MAX_INPUTS, EmbedJob

LATEST = ":latest"


class EmbedBody(Struct, frozen=True, kw_only=True):
    model: str = ""
    input: str | list[str] | None = None  # /api/embed
    prompt: str | None = None  # /api/embeddings
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    truncate: bool | None = None
    options: dict[str, Any] | None = None
    keep_alive: str | float | None = None


DECODER = msgspec.json.Decoder(EmbedBody)


@dataclass(frozen=True, slots=True)
class OllamaEmbedJob(EmbedJob):
    echo: str = ""
    arrived: float = 0.0
    warnings: tuple[str, ...] = ()


class OllamaEmbed:
    """POST /api/embed (`legacy` False) or POST /api/embeddings."""

    def __init__(self, legacy: bool) -> None:
        self.legacy = legacy

    def parse(self, body: bytes) -> OllamaEmbedJob:
        req = common.decode(DECODER, body)
        inputs = self._inputs(req)
        return OllamaEmbedJob(
            inputs,  # type: ignore[arg-type]  # list[str] is a list of EmbedInput
            req.model.removesuffix(LATEST),
            False,
            req.dimensions,
            echo=req.model,
            arrived=time.perf_counter(),
            warnings=_warnings(req),
        )

    def _inputs(self, req: EmbedBody) -> list[str]:
        if self.legacy:
            if req.prompt is None:
                raise InvalidRequest("`prompt` is required", param="prompt")
            return [req.prompt]
        if req.input is None:
            raise InvalidRequest("`input` is required: a string or a list of strings", param="input")
        inputs = [req.input] if isinstance(req.input, str) else req.input
        if not inputs:
            raise InvalidRequest("`input` is empty", param="input")
        if len(inputs) > MAX_INPUTS:
            raise InvalidRequest(f"`input` holds {len(inputs)} inputs; at most {MAX_INPUTS}", param="input")
        return inputs

    def to_json(self, job: OllamaEmbedJob, result: Embeddings) -> bytes:
        vectors = result.vectors.astype("float32")
        if self.legacy:
            return orjson.dumps({"embedding": vectors[0]}, option=orjson.OPT_SERIALIZE_NUMPY)
        body = {
            "model": job.echo,
            "embeddings": vectors,
            "total_duration": int((time.perf_counter() - job.arrived) * NANOS),
            "load_duration": 0,
            "prompt_eval_count": result.prompt_tokens,
        }
        return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _warnings(req: EmbedBody) -> tuple[str, ...]:
    given = [name for name in ("options", "keep_alive") if getattr(req, name) is not None]
    if not given:
        return ()
    return (conv.warning(f"{' and '.join(given)} change nothing for embeddings here (served without them)"),)


EMBED = OllamaEmbed(legacy=False)
EMBEDDINGS = OllamaEmbed(legacy=True)
