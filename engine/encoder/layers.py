"""The few operations the encoder networks are made of, over a plain dict of weights (MLX's
`nn` is untyped; these are a dozen lines and keep the networks checkable)."""

from __future__ import annotations

import math

import mlx.core as mx

Weights = dict[str, mx.array]
MASKED = -1e9  # finite: a fully masked row stays a number, and padding rows are dropped anyway


def linear(w: Weights, name: str, x: mx.array) -> mx.array:
    """`x @ W.T (+ b)`; the bias is optional (nomic-bert has none)."""
    y = x @ w[f"{name}.weight"].T
    bias = w.get(f"{name}.bias")
    return y if bias is None else y + bias


def layer_norm(w: Weights, name: str, x: mx.array, eps: float) -> mx.array:
    return mx.fast.layer_norm(x, w[f"{name}.weight"], w[f"{name}.bias"], eps)


def gelu(x: mx.array) -> mx.array:
    """The exact (erf) GELU BERT was trained with."""
    return x * 0.5 * (1 + mx.erf(x / math.sqrt(2)))


def key_mask_bias(mask: mx.array, dtype: mx.Dtype) -> mx.array:
    """(B, L) with 1 for tokens, 0 for padding → (B, 1, 1, L) to add to attention scores."""
    return ((1 - mask.astype(dtype)) * MASKED)[:, None, None, :].astype(dtype)


def heads(x: mx.array, n_heads: int) -> mx.array:
    """(B, L, H) → (B, heads, L, H / heads)."""
    b, n, _ = x.shape
    return x.reshape(b, n, n_heads, -1).transpose(0, 2, 1, 3)


def attention(q: mx.array, k: mx.array, v: mx.array, bias: mx.array) -> mx.array:
    """Bidirectional attention over (B, heads, L, D), back to (B, L, heads × D)."""
    b, h, n, d = q.shape
    out = mx.fast.scaled_dot_product_attention(q, k, v, scale=d**-0.5, mask=bias)
    return out.transpose(0, 2, 1, 3).reshape(b, n, h * d)
