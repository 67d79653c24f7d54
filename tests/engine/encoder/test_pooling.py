"""engine.encoder.pooling: mean pooling over real tokens only, normalisation, Matryoshka."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlx_serve.engine.encoder.pooling import finish, mean_pool


def test_mean_pool_ignores_padding() -> None:
    hidden = mx.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = mx.array([[1, 1, 0]])
    assert np.allclose(np.array(mean_pool(hidden, mask)), [[2.0, 3.0]])


def test_finish_normalises_at_full_size() -> None:
    out = finish(np.array([[3.0, 4.0, 0.0]]), native=3, dimensions=None)
    assert np.allclose(out, [[0.6, 0.8, 0.0]]) and out.dtype == np.float32


def test_finish_shortens_by_layer_norm_then_truncation() -> None:
    rng = np.random.default_rng(0)
    pooled = rng.normal(size=(2, 16)) * 3 + 1
    out = finish(pooled, native=16, dimensions=4)
    centred = (pooled - pooled.mean(1, keepdims=True)) / pooled.std(1, keepdims=True)
    want = centred[:, :4] / np.linalg.norm(centred[:, :4], axis=1, keepdims=True)
    assert out.shape == (2, 4) and np.allclose(out, want, atol=1e-4)
    assert np.allclose(finish(pooled, 16, 16), finish(pooled, 16, None))
