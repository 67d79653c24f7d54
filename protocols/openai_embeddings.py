"""OpenAI embeddings: POST /v1/embeddings.

`input` is a string, an array of strings, an array of token ids (one input) or an array of
token-id arrays; token ids are the model's own, taken as they are (no special tokens added).
`encoding_format` "float" answers number arrays, "base64" little-endian float32 bytes (what the
official SDKs ask for by default); `dimensions` shortens the vectors of a model trained for it.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
import orjson
from msgspec import Meta

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.host.client import Embeddings
from mlx_serve.engine.types import EmbedInput
from mlx_serve.protocols import openai_common as common

MAX_INPUTS = 2048  # OpenAI's bound on inputs in one call
SHAPES = "a string, an array of strings, an array of token ids, or an array of token-id arrays"


class EmbeddingsBody(msgspec.Struct, frozen=True, kw_only=True):
    """The body of POST /v1/embeddings. Unknown fields are ignored, as on the other OpenAI routes."""

    input: Any
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: str | None = None  # an end-user id for abuse tracking: nothing to do with it here


@dataclass(frozen=True, slots=True)
class EmbedJob:
    inputs: list[EmbedInput]
    model: str
    base64: bool
    dimensions: int | None


_DECODER = msgspec.json.Decoder(EmbeddingsBody)


def parse(body: bytes) -> EmbedJob:
    """Decode and check one embeddings request; InvalidRequest (400) naming the field."""
    req = common.decode(_DECODER, body)
    inputs = inputs_of(req.input)
    return EmbedJob(inputs, req.model or "", req.encoding_format == "base64", req.dimensions)


def inputs_of(raw: Any) -> list[EmbedInput]:
    if isinstance(raw, str):
        return [raw]
    if not isinstance(raw, list):
        raise InvalidRequest(f"`input` must be {SHAPES}", param="input")
    if not raw:
        raise InvalidRequest("`input` is empty", param="input")
    if len(raw) > MAX_INPUTS:
        raise InvalidRequest(
            f"`input` holds {len(raw)} inputs; at most {MAX_INPUTS} in one call", param="input"
        )
    if all(isinstance(x, str) for x in raw):
        return list(raw)
    if all(_is_id(x) for x in raw):
        return [list(raw)]
    if all(isinstance(x, list) and all(_is_id(t) for t in x) for x in raw):
        return [list(x) for x in raw]
    raise InvalidRequest(f"`input` must be {SHAPES}, not a mix", param="input")


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def to_json(job: EmbedJob, result: Embeddings, model_id: str) -> bytes:
    """The whole answer: one `embedding` object per input, in order, and the tokens read."""
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(v, job.base64)}
        for i, v in enumerate(result.vectors)
    ]
    usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
    body = {"object": "list", "data": data, "model": job.model or model_id, "usage": usage}
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def _encoded(vector: np.ndarray, as_base64: bool) -> np.ndarray | str:
    if as_base64:
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.astype(np.float32)
