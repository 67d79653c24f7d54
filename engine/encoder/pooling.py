"""From hidden states to the vectors a client gets: mean pooling, then L2 normalisation, with
Matryoshka shortening for models trained for it (layer-norm, truncate, normalise again)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

NORM_FLOOR = 1e-12  # sentence-transformers' F.normalize eps: a zero vector stays zero


def mean_pool(hidden: mx.array, mask: mx.array) -> mx.array:
    """(B, L, H) hidden states, (B, L) 0/1 mask → (B, H) the mean over each row's tokens."""
    m = mask.astype(hidden.dtype)[:, :, None]
    return (hidden * m).sum(axis=1) / mx.maximum(m.sum(axis=1), 1)


def normalized(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    out: np.ndarray = (vectors / np.maximum(norms, NORM_FLOOR)).astype(np.float32)
    return out


def shortened(pooled: np.ndarray, dimensions: int, eps: float = 1e-5) -> np.ndarray:
    """Matryoshka: layer-norm without affine over the whole pooled vector, keep the first
    `dimensions`, normalise (nomic-embed-text-v1.5's recipe)."""
    mean = pooled.mean(axis=-1, keepdims=True)
    var = pooled.var(axis=-1, keepdims=True)
    return normalized(((pooled - mean) / np.sqrt(var + eps))[:, :dimensions])


def finish(pooled: np.ndarray, native: int, dimensions: int | None) -> np.ndarray:
    """The client's vectors: normalised, shortened when fewer `dimensions` than `native` asked."""
    if dimensions is None or dimensions >= native:
        return normalized(pooled)
    return shortened(pooled, dimensions)
