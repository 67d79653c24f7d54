"""One forward of an encoder over a batch of token-id rows: pad, run, mean-pool."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from mlx_serve.engine.encoder.batcher import plan_forwards
from mlx_serve.engine.encoder.model import EncoderModel
from mlx_serve.engine.encoder.pooling import finish, mean_pool
from mlx_serve.engine.errors import EngineFailed

log = logging.getLogger("mlx_serve.engine")


def pooled(model: EncoderModel, rows: Sequence[Sequence[int]]) -> np.ndarray:
    """(len(rows), native dimensions) float32 mean-pooled vectors, one forward per planned group."""
    out = np.zeros((len(rows), model.dimensions), dtype=np.float32)
    for group in plan_forwards([len(r) for r in rows], model.forward_tokens):
        out[group] = _forward(model, [rows[i] for i in group])
    return out


def _forward(model: EncoderModel, rows: Sequence[Sequence[int]]) -> np.ndarray:
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int32)
    mask = np.zeros((len(rows), width), dtype=np.int32)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    ids_mx, mask_mx = mx.array(ids), mx.array(mask)
    vectors = mean_pool(model.network(ids_mx, mask_mx).astype(mx.float32), mask_mx)
    mx.eval(vectors)
    return np.array(vectors, copy=True)


CallRows = tuple[list[list[int]], int | None]  # one call's token rows and the dimensions it asked


def embed_group(model: EncoderModel, calls: Sequence[CallRows]) -> list[np.ndarray | EngineFailed]:
    """The vectors of calls that arrived together, run as one group; if the group fails, each
    call is run alone, so one bad input fails only its own call."""
    try:
        vectors = pooled(model, [r for rows, _ in calls for r in rows])
    except Exception:
        if len(calls) > 1:
            return [embed_group(model, [call])[0] for call in calls]
        log.exception("embedding failed")
        return [EngineFailed("the encoder failed on this input; see the server log")]
    out: list[np.ndarray | EngineFailed] = []
    at = 0
    for rows, dimensions in calls:
        out.append(finish(vectors[at : at + len(rows)], model.dimensions, dimensions))
        at += len(rows)
    return out
