"""Oracles for the GGUF loader tests.

- `reference_tokenizer`: transformers' own GGUF tokenizer conversion, i.e.
  `AutoTokenizer.from_pretrained(folder, gguf_file=name)`. transformers reads GGUF metadata with
  torch imported, and picks the tokenizer class from a config it parses with `gguf.GGUFReader`
  (minutes for a 262k vocabulary). Without torch here, those two steps are stood in for; the
  tokenizer itself is still built by transformers' conversion code.
- `write_tiny_gguf`: a small random model written the way llama.cpp writes one (its tensor
  names, q/k row permutation, Gemma's (1 + w) norms, block quantization), with the logits the
  original MLX model gives, so a conversion can be checked end to end in a second.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from mlx_serve.engine.gguf.reader import read_gguf

Q = GGMLQuantizationType

TRICKY_STRINGS = (
    "Hello world",
    "  multiple   spaces  between   words  ",
    " leading space",
    "trailing spaces   ",
    "12345 3.14159 and 1,000,000 or 2024-01-31",
    "日本語のテキスト、中文字符和한국어",
    "emoji 🤗🚀 ok 👍🏽 family 👨‍👩‍👧",
    "def f(x):\n\treturn x  # tab\n\n\n    indented()\r\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos> <pad>",
    "\n\n\n",
    "   ",
    "ünïcödé façade naïve Ångström",
    "non\u00a0breaking\u200bzero width",
    "<table><tr><td>x</td></tr></table>",
    "$$x^2$$ {{var}} [[link]] <not_a_token>",
    # code, digits, CJK and the markup a Qwen2.5 chat carries
    "x = 1234567890 + 3.14e-10; y = 0xFF",
    "for (int i = 0; i < n; ++i) {\n    sum += a[i] * b[i];\n}",
    "    def __init__(self):\n        self.x = [1, 2, 3]\n",
    "中文注释：计算斐波那契数列 // コメント",
    "I'm sure it's what THEY'LL do, we'd",
    "<|im_start|>system\nYou are Qwen<|im_end|>\n<|im_start|>user\n",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    '<tools>\n{"type": "function"}\n</tools><|endoftext|>',
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "e\u0301 cafe\u0301 [PAD151665]",
)


def load_model(folder: Path) -> tuple[Any, Any]:
    """`mlx_lm.load` of a converted folder: (model, TokenizerWrapper)."""
    import mlx_lm

    loaded: Any = mlx_lm.load(str(folder))
    return loaded[0], loaded[1]


def load_safetensors(path: Path) -> dict[str, mx.array]:
    loaded: Any = mx.load(str(path))
    return dict(loaded)


# --- transformers' GGUF tokenizer -----------------------------------------------------------


def reference_tokenizer(gguf_path: Path) -> Any:
    """`AutoTokenizer.from_pretrained(dir, gguf_file=name)`, runnable without torch."""
    from transformers import AutoTokenizer

    reader = types.ModuleType("transformers.integrations.gguf.reader")
    reader.read_gguf_metadata = _read_gguf_metadata  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, reader.__name__, reader)
        mp.setattr("transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint", _gguf_model_type)
        return AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)


def _read_gguf_metadata(path: str, string_arrays: Any = ()) -> tuple[dict[str, Any], tuple[str, ...]]:
    """transformers' reader contract: string arrays only when asked for (else their length)."""
    gguf = read_gguf(path)
    metadata: dict[str, Any] = {}
    for key, value in gguf.metadata.items():
        if isinstance(value, np.ndarray):
            value = value.tolist()
        elif isinstance(value, list) and key not in string_arrays and value and isinstance(value[0], str):
            value = len(value)
        metadata[key] = value
    return metadata, tuple(gguf.tensors)


def _gguf_model_type(path: str, return_tensors: bool = False, **_: Any) -> dict[str, Any]:
    """All AutoTokenizer takes from this config is the model type that picks the class."""
    architecture = read_gguf(path).architecture
    return {"config": {"model_type": {"gemma3": "gemma3_text"}.get(architecture, architecture)}}


# --- tiny llama.cpp-style GGUF files --------------------------------------------------------


@dataclass(frozen=True)
class TinyGGUF:
    path: Path
    prompt: list[int]
    logits: np.ndarray  # the original MLX model's logits for `prompt`, shape (len, vocab)


LLAMA_TYPES = {
    "token_embd": Q.Q8_0, "attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.Q8_0,
    "attn_output": Q.F16, "ffn_gate": Q.Q5_0, "ffn_up": Q.BF16, "ffn_down": Q.Q4_0, "output": Q.Q4_1,
}  # fmt: skip
GEMMA3_TYPES = {"token_embd": Q.Q8_0, "attn_q": Q.Q4_0, "attn_v": Q.Q5_0, "ffn_down": Q.Q4_1}
# the real Qwen2.5-Coder files' types, spread over the tensors
QWEN2_TYPES = {
    "token_embd": Q.Q5_0, "attn_q": Q.Q4_K, "attn_k": Q.Q5_0, "attn_v": Q.Q8_0, "attn_output": Q.Q4_K,
    "ffn_gate": Q.Q5_0, "ffn_up": Q.Q4_K, "ffn_down": Q.Q6_K, "output": Q.Q6_K,
}  # fmt: skip
_TINY_TYPES = {"llama": LLAMA_TYPES, "gemma3": GEMMA3_TYPES, "qwen2": QWEN2_TYPES}

_LLAMA_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}  # fmt: skip
_GEMMA3_NAMES = {
    **_LLAMA_NAMES, "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}  # fmt: skip


# Where each K-quant block keeps its float16 super-block scales: (byte offset, magnitude).
_K_BLOCK_SCALES = {Q.Q4_K: ((0, 1e-3), (2, 1e-3)), Q.Q6_K: ((208, 1e-4),)}


def random_k_blocks(rows: int, columns: int, ggml_type: Q, seed: int = 0) -> np.ndarray:
    """Random valid blocks of a K-quant that gguf cannot quantize to: random bytes, with
    small finite float16 super-block scales (any bytes are valid for the rest)."""
    from gguf import GGML_QUANT_SIZES

    block_weights, block_bytes = GGML_QUANT_SIZES[ggml_type]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows, columns // block_weights, block_bytes), dtype=np.uint8)
    for offset, magnitude in _K_BLOCK_SCALES[ggml_type]:
        scale = rng.uniform(0.5, 1.0, size=blocks.shape[:2]) * magnitude
        blocks[..., offset : offset + 2] = scale.astype(np.float16)[..., None].view(np.uint8)
    return blocks.reshape(rows, -1)


def llama_cpp_permute(rows: np.ndarray, n_heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in numpy."""
    return (
        rows.reshape(n_heads, 2, rows.shape[0] // n_heads // 2, *rows.shape[1:])
        .swapaxes(1, 2)
        .reshape(rows.shape)
    )


def write_tiny_gguf(path: Path, architecture: str, *, tied: bool, seed: int = 0) -> TinyGGUF:
    """A random 6-layer llama, gemma3 or qwen2 written as llama.cpp would, plus its reference logits."""
    from mlx.utils import tree_flatten

    model, config = _tiny_model(architecture, tied=tied, seed=seed)
    writer = GGUFWriter(str(path), architecture)
    _add_hparams(writer, architecture, config)
    _add_tokenizer(writer, architecture)
    types_ = _TINY_TYPES[architecture]
    reference: list[tuple[str, mx.array]] = []
    params: Any = tree_flatten(model.parameters())
    for name, value in params:
        gguf_name = _gguf_name(name, architecture)
        stored, original = _store(np.array(value), gguf_name, architecture, config, types_)
        writer.add_tensor(gguf_name, stored[0], raw_dtype=stored[1])
        reference.append((name, mx.array(original)))
    model.load_weights(reference)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    prompt = [2, 40, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200, 210, 220]
    logits = np.array(model(mx.array([prompt]))[0].astype(mx.float32))
    return TinyGGUF(path, prompt, logits)


def _tiny_model(architecture: str, *, tied: bool, seed: int) -> tuple[Any, dict[str, Any]]:
    from mlx_lm.models import gemma3_text, llama, qwen2

    config: dict[str, Any] = {
        "hidden_size": 64, "num_hidden_layers": 6, "intermediate_size": 96, "num_attention_heads": 4,
        "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "vocab_size": 262, "rope_theta": 10000.0,
        "tie_word_embeddings": tied, "max_position_embeddings": 256,
    }  # fmt: skip
    mx.random.seed(seed)
    if architecture == "llama":
        model: Any = llama.Model(llama.ModelArgs.from_dict({**config, "model_type": "llama"}))  # type: ignore[no-untyped-call]
    elif architecture == "qwen2":
        # K-quant blocks hold 256 weights: every matrix needs a multiple of 256 columns
        config |= {"hidden_size": 256, "intermediate_size": 256, "rope_theta": 1e6}
        model = qwen2.Model(qwen2.ModelArgs.from_dict({**config, "model_type": "qwen2"}))  # type: ignore[no-untyped-call]
    else:
        if not tied:
            raise ValueError("Gemma 3 always ties its embeddings")
        extra = {"model_type": "gemma3_text", "head_dim": 32, "query_pre_attn_scalar": 32,
                 "sliding_window": 8, "rope_theta": 1e6}  # fmt: skip
        config |= extra
        model = gemma3_text.Model(gemma3_text.ModelArgs.from_dict(config))  # type: ignore[no-untyped-call]
        model.sanitize({})  # no lm_head.weight: ties the head to the embedding, as the file will
    # random norms (not ones) so that a misplaced or unshifted norm shows in the logits
    model.update(_randomize_norms(model))
    return model, config


def _randomize_norms(model: Any) -> Any:
    from mlx.utils import tree_flatten, tree_unflatten

    params: Any = tree_flatten(model.parameters())
    return tree_unflatten([(k, mx.random.uniform(-0.5, 0.5, v.shape)) for k, v in params if "norm" in k])


def _gguf_name(name: str, architecture: str) -> str:
    names = _GEMMA3_NAMES if architecture == "gemma3" else _LLAMA_NAMES
    if name.startswith("model.layers."):
        _, _, layer, rest = name.split(".", 3)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{layer}.{names[module]}.{kind}"
    globals_ = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    module, kind = name.rsplit(".", 1)
    return f"{globals_[module]}.{kind}"


def _store(
    value: np.ndarray, gguf_name: str, architecture: str, config: dict[str, Any], types_: dict[str, Q]
) -> tuple[tuple[np.ndarray, Q], np.ndarray]:
    """((payload, ggml type), the weight the MLX model must hold to match what was stored)."""
    base = gguf_name.split(".")[-2]
    if architecture == "gemma3" and gguf_name.endswith("norm.weight"):
        return (value + 1.0, Q.F32), value
    ggml_type = types_.get(base, Q.F32) if value.ndim == 2 else Q.F32
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}.get(base)
    permute = architecture == "llama" and heads
    if ggml_type in _K_BLOCK_SCALES:
        # gguf cannot quantize to K-quants: random blocks stand in for the weights
        assert not permute, "no permuted K-quant tensors in the tiny models"
        blocks = random_k_blocks(*value.shape, ggml_type)
        return (blocks, ggml_type), dequantize(blocks, ggml_type)
    original = dequantize(quantize(value, ggml_type), ggml_type).reshape(value.shape)
    if permute:
        value = llama_cpp_permute(value, heads)
    return (quantize(value, ggml_type), ggml_type), original


def _add_hparams(writer: GGUFWriter, architecture: str, config: dict[str, Any]) -> None:
    a = architecture
    writer.add_uint32(f"{a}.block_count", config["num_hidden_layers"])
    writer.add_uint32(f"{a}.context_length", config["max_position_embeddings"])
    writer.add_uint32(f"{a}.embedding_length", config["hidden_size"])
    writer.add_uint32(f"{a}.feed_forward_length", config["intermediate_size"])
    writer.add_uint32(f"{a}.attention.head_count", config["num_attention_heads"])
    writer.add_uint32(f"{a}.attention.head_count_kv", config["num_key_value_heads"])
    writer.add_float32(f"{a}.rope.freq_base", config["rope_theta"])
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", config["rms_norm_eps"])
    if architecture == "gemma3":
        writer.add_uint32(f"{a}.attention.key_length", config["head_dim"])
        writer.add_uint32(f"{a}.attention.value_length", config["head_dim"])
        writer.add_uint32(f"{a}.attention.sliding_window", config["sliding_window"])


def _add_tokenizer(writer: GGUFWriter, architecture: str) -> None:
    """262 tokens either way: 3 controls, 256 byte tokens, 3 merged tokens."""
    if architecture in ("llama", "qwen2"):
        from mlx_serve.engine.gguf.tokenizer import _byte_alphabet

        alphabet = [_byte_alphabet()[b] for b in range(256)]
        tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *alphabet, "Ġt", "he", "Ġthe"]
        writer.add_string("tokenizer.ggml.model", "gpt2")
        writer.add_string("tokenizer.ggml.pre", "qwen2" if architecture == "qwen2" else "default")
        writer.add_array("tokenizer.ggml.merges", ["Ġ t", "h e", "Ġt he"])
        types_ = [3, 3, 3] + [1] * 259
    else:
        tokens = ["<pad>", "<eos>", "<bos>", *(f"<0x{b:02X}>" for b in range(256)), "▁", "th", "▁th"]
        writer.add_string("tokenizer.ggml.model", "llama")
        writer.add_array("tokenizer.ggml.scores", [0.0] * len(tokens))
        writer.add_bool("tokenizer.ggml.add_space_prefix", False)
        types_ = [3, 3, 3] + [6] * 256 + [1] * 3
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_array("tokenizer.ggml.token_type", types_)
    byte_level = architecture != "gemma3"
    writer.add_uint32("tokenizer.ggml.bos_token_id", 1 if byte_level else 2)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 2 if byte_level else 1)
