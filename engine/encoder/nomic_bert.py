"""nomic-bert (nomic-embed-text-v1.5) from its GGUF: BERT's post-LayerNorm blocks with rotary
positions (non-interleaved), one fused qkv projection, a SwiGLU feed-forward and no linear
biases; llama.cpp's tensor names, read as they are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlx_serve.engine.encoder.layers import Weights, attention, heads, key_mask_bias, layer_norm, linear


@dataclass(frozen=True, slots=True)
class NomicConfig:
    layers: int
    hidden: int
    n_heads: int
    rope_base: float
    eps: float

    @classmethod
    def from_gguf(cls, md: dict[str, Any]) -> NomicConfig:
        return cls(
            layers=int(md["nomic-bert.block_count"]),
            hidden=int(md["nomic-bert.embedding_length"]),
            n_heads=int(md["nomic-bert.attention.head_count"]),
            rope_base=float(md.get("nomic-bert.rope.freq_base", 1000.0)),
            eps=float(md.get("nomic-bert.attention.layer_norm_epsilon", 1e-12)),
        )


@dataclass(frozen=True, slots=True)
class NomicBert:
    """`model(ids, mask) -> hidden states` for a batch of right-padded rows (mask 1 = token)."""

    config: NomicConfig
    weights: Weights

    def __call__(self, ids: mx.array, mask: mx.array) -> mx.array:
        w, c = self.weights, self.config
        x = layer_norm(w, "token_embd_norm", w["token_embd.weight"][ids] + w["token_types.weight"][0], c.eps)
        bias = key_mask_bias(mask, x.dtype)
        for i in range(c.layers):
            x = self._layer(f"blk.{i}", x, bias)
        return x

    def _layer(self, at: str, x: mx.array, bias: mx.array) -> mx.array:
        w, c = self.weights, self.config
        q, k, v = mx.split(linear(w, f"{at}.attn_qkv", x), 3, axis=-1)
        q, k, v = heads(q, c.n_heads), heads(k, c.n_heads), heads(v, c.n_heads)
        d = q.shape[-1]
        q = mx.fast.rope(q, d, traditional=False, base=c.rope_base, scale=1.0, offset=0)
        k = mx.fast.rope(k, d, traditional=False, base=c.rope_base, scale=1.0, offset=0)
        x = layer_norm(
            w, f"{at}.attn_output_norm", x + linear(w, f"{at}.attn_output", attention(q, k, v, bias)), c.eps
        )
        gate = linear(w, f"{at}.ffn_gate", x)
        f = linear(w, f"{at}.ffn_down", linear(w, f"{at}.ffn_up", x) * (gate * mx.sigmoid(gate)))
        return layer_norm(w, f"{at}.layer_output_norm", x + f, c.eps)
