"""What each supported GGUF architecture means to mlx-lm: config.json fields and tensor names.

llama.cpp's names and hyperparameter keys are mapped to the Hugging Face ones mlx-lm's model
classes read. An architecture or a tensor that is not understood is an error, never skipped:
a silently dropped tensor would load as random weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from mlx_serve.engine.gguf.reader import GGUFFile

_LLAMA_LAYER_NAMES = MappingProxyType(
    {
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
    }
)

_GEMMA3_LAYER_NAMES = MappingProxyType(
    {
        **_LLAMA_LAYER_NAMES,
        "attn_q_norm": "self_attn.q_norm",
        "attn_k_norm": "self_attn.k_norm",
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    }
)

_GLOBAL_NAMES = MappingProxyType(
    {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
)

_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_GLOBAL_TENSOR = re.compile(r"(\w+)\.(weight|bias)")

SUPPORTED = ("llama", "gemma3", "qwen2")

# llama.cpp hard-codes the 27B's attention scale (hidden / heads, not head_dim) by layer count.
_GEMMA3_27B_LAYERS = 62


@dataclass(frozen=True, slots=True)
class Architecture:
    """How to turn one GGUF architecture into an mlx-lm model folder."""

    name: str
    layer_names: MappingProxyType[str, str]
    # llama.cpp reorders llama's q/k rows for its rope kernel; mlx-lm wants HF's order back
    unpermute_qk: bool
    # Gemma norms are stored as (1 + w) by llama.cpp; mlx-lm's RMSNorm adds the 1 itself
    norm_offset: float

    def mlx_name(self, gguf_name: str) -> str:
        """The mlx-lm parameter name for a GGUF tensor name; ValueError when unknown."""
        if m := _LAYER_TENSOR.fullmatch(gguf_name):
            layer, base, kind = m.groups()
            if base in self.layer_names:
                return f"model.layers.{layer}.{self.layer_names[base]}.{kind}"
        elif (m := _GLOBAL_TENSOR.fullmatch(gguf_name)) and m.group(1) in _GLOBAL_NAMES:
            return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
        raise ValueError(f"GGUF tensor {gguf_name!r} is not understood for {self.name}")

    def is_norm(self, gguf_name: str) -> bool:
        return gguf_name.endswith("norm.weight")


def architecture_for(gguf: GGUFFile) -> Architecture:
    """The Architecture of a parsed file; ValueError naming it when it is not supported."""
    match gguf.architecture:
        case "llama":
            return Architecture("llama", _LLAMA_LAYER_NAMES, unpermute_qk=True, norm_offset=0.0)
        case "gemma3":
            return Architecture("gemma3", _GEMMA3_LAYER_NAMES, unpermute_qk=False, norm_offset=1.0)
        case "qwen2":
            # convert_hf_to_gguf.py's Qwen2Model keeps HF's row order (llama.cpp runs it with NEOX rope)
            return Architecture("qwen2", _LLAMA_LAYER_NAMES, unpermute_qk=False, norm_offset=0.0)
    raise ValueError(
        f"GGUF architecture {gguf.architecture!r} is not supported (supported: {', '.join(SUPPORTED)})"
    )


@dataclass(frozen=True, slots=True)
class Hparams:
    """The file's `<arch>.*` hyperparameters, read by their short key."""

    gguf: GGUFFile

    def get(self, key: str, default: Any = None) -> Any:
        value = self.gguf.metadata.get(f"{self.gguf.architecture}.{key}", default)
        return value.item() if hasattr(value, "item") else value

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ValueError(f"GGUF file lacks {self.gguf.architecture}.{key}")
        return value


def model_config(gguf: GGUFFile) -> dict[str, Any]:
    """config.json for mlx-lm, without the quantization section."""
    hp = Hparams(gguf)
    match gguf.architecture:
        case "llama":
            config = _llama_config(hp)
        case "gemma3":
            config = _gemma3_config(hp)
        case "qwen2":
            config = _qwen2_config(hp)
        case other:
            raise ValueError(f"GGUF architecture {other!r} is not supported")
    return {**_shared_config(hp), **config}


def _shared_config(hp: Hparams) -> dict[str, Any]:
    heads = hp.require("attention.head_count")
    hidden = hp.require("embedding_length")
    return {
        "hidden_size": hidden,
        "num_hidden_layers": hp.require("block_count"),
        "intermediate_size": hp.require("feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": hp.get("attention.head_count_kv", heads),
        "head_dim": hp.get("attention.key_length", hidden // heads),
        "rms_norm_eps": hp.require("attention.layer_norm_rms_epsilon"),
        "vocab_size": hp.gguf.tensors["token_embd.weight"].shape[0],
        "max_position_embeddings": hp.require("context_length"),
        "rope_theta": hp.get("rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(hp),
        "tie_word_embeddings": "output.weight" not in hp.gguf.tensors,
    }


def _llama_config(hp: Hparams) -> dict[str, Any]:
    if "rope_freqs.weight" in hp.gguf.tensors:
        # Llama 3.1-style rope: the file keeps only the computed factors, not the parameters
        raise ValueError("GGUF llama with rope_freqs (Llama 3.1 rope scaling) is not supported yet")
    names = hp.gguf.tensors
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": "blk.0.attn_q.bias" in names,
        "mlp_bias": "blk.0.ffn_up.bias" in names,
    }


def _qwen2_config(hp: Hparams) -> dict[str, Any]:
    names = hp.gguf.tensors
    if "blk.0.attn_q.bias" not in names:
        # mlx-lm's qwen2 always has q/k/v biases; a file without them is some other model
        raise ValueError("GGUF qwen2 file has no attention biases (blk.0.attn_q.bias)")
    hidden, heads = hp.require("embedding_length"), hp.require("attention.head_count")
    if hp.get("attention.key_length", hidden // heads) != hidden // heads:
        raise ValueError("GGUF qwen2 with head_dim != hidden / heads is not supported")
    return {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}


def _gemma3_config(hp: Hparams) -> dict[str, Any]:
    layers = hp.require("block_count")
    head_dim = hp.require("attention.key_length")
    hidden, heads = hp.require("embedding_length"), hp.require("attention.head_count")
    scalar = hidden // heads if layers == _GEMMA3_27B_LAYERS else head_dim
    return {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "sliding_window": hp.require("attention.sliding_window"),
        # Not in the file: llama.cpp hard-codes these for every Gemma 3 size
        "sliding_window_pattern": _int_or(hp.get("attention.sliding_window_pattern"), 6),
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": scalar,
    }


def _rope_scaling(hp: Hparams) -> dict[str, Any] | None:
    kind = hp.get("rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = hp.get("rope.scaling.factor")
    if kind == "linear" and factor:
        return {"type": "linear", "rope_type": "linear", "factor": factor}
    raise ValueError(f"GGUF rope scaling {kind!r} is not supported yet")


def _int_or(value: Any, default: int) -> int:
    """A per-layer list (newer llama.cpp files) is not a period; fall back to the default."""
    return value if isinstance(value, int) else default
