"""One forward of an encoder over a batch of token-id rows: pad, run, mean-pool."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from engine.encoder.batcher import plan_forwards
from engine.encoder.model import EncoderModel
from engine.encoder.pooling import mean_pool


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
