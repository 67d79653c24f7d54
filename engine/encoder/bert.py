"""BERT as a sentence encoder (all-MiniLM-L6-v2 and its kin): post-LayerNorm blocks, absolute
positions, exact GELU; weights as a transformers `BertModel` safetensors file names them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlx_serve.engine.encoder.layers import Weights, attention, gelu, heads, key_mask_bias, layer_norm, linear


@dataclass(frozen=True, slots=True)
class BertConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    layer_norm_eps: float = 1e-12

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BertConfig:
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})


@dataclass(frozen=True, slots=True)
class Bert:
    """`model(ids, mask) -> hidden states` for a batch of right-padded rows (mask 1 = token)."""

    config: BertConfig
    weights: Weights

    def __call__(self, ids: mx.array, mask: mx.array) -> mx.array:
        w, eps = self.weights, self.config.layer_norm_eps
        x = w["embeddings.word_embeddings.weight"][ids]
        x = x + w["embeddings.position_embeddings.weight"][: ids.shape[1]]
        x = layer_norm(w, "embeddings.LayerNorm", x + w["embeddings.token_type_embeddings.weight"][0], eps)
        bias = key_mask_bias(mask, x.dtype)
        for i in range(self.config.num_hidden_layers):
            x = self._layer(f"encoder.layer.{i}", x, bias)
        return x

    def _layer(self, at: str, x: mx.array, bias: mx.array) -> mx.array:
        w, eps, n = self.weights, self.config.layer_norm_eps, self.config.num_attention_heads
        q, k, v = (heads(linear(w, f"{at}.attention.self.{p}", x), n) for p in ("query", "key", "value"))
        a = linear(w, f"{at}.attention.output.dense", attention(q, k, v, bias))
        x = layer_norm(w, f"{at}.attention.output.LayerNorm", x + a, eps)
        f = linear(w, f"{at}.output.dense", gelu(linear(w, f"{at}.intermediate.dense", x)))
        return layer_norm(w, f"{at}.output.LayerNorm", x + f, eps)


def bert_weights(raw: dict[str, mx.array]) -> Weights:
    """A transformers BertModel checkpoint's tensors, float32, without the `bert.` prefix some
    carry and the parts a sentence encoder does not use (pooler, position_ids, MLM head)."""
    out = {}
    for name, value in raw.items():
        name = name.removeprefix("bert.")
        if not name.startswith(("pooler.", "cls.")) and not name.endswith("position_ids"):
            out[name] = value.astype(mx.float32)
    return out
