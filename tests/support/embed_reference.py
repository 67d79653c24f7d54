"""Reference sentence embeddings in plain numpy (float64), written from the architectures'
published definitions and sharing nothing with engine.encoder but the weights and the
tokenizer's ids: the oracle the served vectors are held to (cosine >= 0.999).

The BERT reference was cross-checked once against sentence-transformers: its cosine on
"A man is eating food." / "A man is eating a piece of bread." is 0.7553, the value
sentence-transformers gives for all-MiniLM-L6-v2 (MODELS.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

Arrays = Mapping[str, np.ndarray]


def _ln(x: np.ndarray, w: np.ndarray | None, b: np.ndarray | None, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    return y if w is None else y * w + (0 if b is None else b)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, n_heads: int) -> np.ndarray:
    """Single-sequence full attention: (L, H) each → (L, H)."""
    n, h = q.shape
    d = h // n_heads
    qh, kh, vh = (t.reshape(n, n_heads, d).transpose(1, 0, 2) for t in (q, k, v))
    p = _softmax(qh @ kh.transpose(0, 2, 1) / np.sqrt(d))
    return (p @ vh).transpose(1, 0, 2).reshape(n, h)


_ERF = np.vectorize(math.erf)


def _gelu(x: np.ndarray) -> np.ndarray:
    return np.asarray(x * 0.5 * (1 + _ERF(x / np.sqrt(2))))


def bert_embedding(w: Arrays, ids: Sequence[int], n_heads: int, eps: float = 1e-12) -> np.ndarray:
    """Mean-pooled, L2-normalised sentence vector of one input under a BertModel's weights."""
    n_layers = 1 + max(int(k.split(".")[2]) for k in w if k.startswith("encoder.layer."))
    x = (
        w["embeddings.word_embeddings.weight"][list(ids)]
        + w["embeddings.position_embeddings.weight"][: len(ids)]
    )
    x = _ln(
        x + w["embeddings.token_type_embeddings.weight"][0],
        w["embeddings.LayerNorm.weight"],
        w["embeddings.LayerNorm.bias"],
        eps,
    )

    def lin(name: str, t: np.ndarray) -> np.ndarray:
        return t @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    for i in range(n_layers):
        p = f"encoder.layer.{i}"
        q, k, v = (lin(f"{p}.attention.self.{s}", x) for s in ("query", "key", "value"))
        a = lin(f"{p}.attention.output.dense", _attend(q, k, v, n_heads))
        x = _ln(
            x + a, w[f"{p}.attention.output.LayerNorm.weight"], w[f"{p}.attention.output.LayerNorm.bias"], eps
        )
        f = lin(f"{p}.output.dense", _gelu(lin(f"{p}.intermediate.dense", x)))
        x = _ln(x + f, w[f"{p}.output.LayerNorm.weight"], w[f"{p}.output.LayerNorm.bias"], eps)
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)


def _rotate_half_rope(x: np.ndarray, base: float) -> np.ndarray:
    """GPT-NeoX (non-interleaved) rotary positions on (heads, L, D): dims i and i + D/2 pair."""
    _, n, d = x.shape
    inv = base ** (-np.arange(0, d, 2) / d)
    angles = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(angles), np.sin(angles)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def nomic_pooled(
    w: Arrays, ids: Sequence[int], n_heads: int, base: float = 1000.0, eps: float = 1e-12
) -> np.ndarray:
    """Mean-pooled (not yet normalised) vector of one input under nomic-bert's GGUF weights, as
    transformers' nomic_bert computes it: post-norm blocks, rotary q/k, SwiGLU (fc11 * silu(fc12))."""
    n_layers = 1 + max(int(k.split(".")[1]) for k in w if k.startswith("blk."))
    x = _ln(
        w["token_embd.weight"][list(ids)] + w["token_types.weight"][0],
        w["token_embd_norm.weight"],
        w["token_embd_norm.bias"],
        eps,
    )
    n, h = x.shape
    d = h // n_heads
    for i in range(n_layers):
        p = f"blk.{i}"
        q, k, v = np.split(x @ w[f"{p}.attn_qkv.weight"].T, 3, axis=-1)
        qh, kh, vh = (t.reshape(n, n_heads, d).transpose(1, 0, 2) for t in (q, k, v))
        qh, kh = _rotate_half_rope(qh, base), _rotate_half_rope(kh, base)
        att = (_softmax(qh @ kh.transpose(0, 2, 1) / np.sqrt(d)) @ vh).transpose(1, 0, 2).reshape(n, h)
        x = _ln(
            x + att @ w[f"{p}.attn_output.weight"].T,
            w[f"{p}.attn_output_norm.weight"],
            w[f"{p}.attn_output_norm.bias"],
            eps,
        )
        gate = x @ w[f"{p}.ffn_gate.weight"].T
        f = ((x @ w[f"{p}.ffn_up.weight"].T) * (gate / (1 + np.exp(-gate)))) @ w[f"{p}.ffn_down.weight"].T
        x = _ln(x + f, w[f"{p}.layer_output_norm.weight"], w[f"{p}.layer_output_norm.bias"], eps)
    return np.asarray(x.mean(0))


def matryoshka(pooled: np.ndarray, dimensions: int) -> np.ndarray:
    """nomic's recipe: layer_norm without affine, keep the first `dimensions`, L2-normalise."""
    y = _ln(pooled, None, None, 1e-5)[:dimensions]
    return y / np.linalg.norm(y)
