"""Will it fit? A model's memory facts from its files alone, before anything loads.

From an mlx-lm folder (config.json and the safetensors headers) or a GGUF file (its metadata and
tensor table): the weights' bytes as they will be served, the KV bytes one token adds, and so
how long a context one row may have and how many rows of a given context fit a memory budget.
The engine's own memory plan (engine.batch.admission) measures the loaded model and counts a
step's transient too; this is the estimate `mlx-serve doctor MODEL` prints without loading.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlx_serve.engine.model.memory_probe import MAX_CONTEXT_KEYS

DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "U32": 4,
}
CONFIG_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True, slots=True)
class Fit:
    """What a model needs, and what fits a budget of `budget_bytes`."""

    model: str
    parameters: int
    weights_bytes: int
    kv_bytes_per_token: int
    max_position: int | None
    budget_bytes: int

    def max_context(self) -> int:
        """The longest context one row may hold within the budget (and the model's positions)."""
        room = max(self.budget_bytes - self.weights_bytes, 0)
        tokens = room // self.kv_bytes_per_token if self.kv_bytes_per_token else 0
        return min(tokens, self.max_position) if self.max_position else tokens

    def rows_at(self, context: int) -> int:
        """Rows of `context` tokens each that fit beside the weights."""
        room = max(self.budget_bytes - self.weights_bytes, 0)
        return room // (self.kv_bytes_per_token * context) if self.kv_bytes_per_token and context else 0

    def lines(self, contexts: tuple[int, ...] = (4096, 32768)) -> list[str]:
        gib = 2**30
        out = [
            f"model: {self.model}",
            f"  weights: {self.weights_bytes / gib:.2f} GiB ({self.parameters / 1e9:.2f} B parameters)",
            f"  KV per token: {self.kv_bytes_per_token / 1024:.1f} KiB",
            f"  memory budget: {self.budget_bytes / gib:.1f} GiB",
            f"  longest context for one row: {self.max_context():,} tokens"
            + (f" (the model's positions: {self.max_position:,})" if self.max_position else ""),
        ]
        out += [f"  rows of {c:,} tokens that fit: {self.rows_at(c)}" for c in contexts]
        return out


def kv_bytes_per_token(config: dict[str, Any], dtype_bytes: int) -> int:
    """K and V of every layer for one token: 2 × layers × KV heads × head dim × dtype bytes."""
    text = config.get("text_config") or config
    layers = int(text["num_hidden_layers"])
    heads = int(text["num_attention_heads"])
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def max_position(config: dict[str, Any]) -> int | None:
    text = config.get("text_config") or config
    for key in MAX_CONTEXT_KEYS:
        if isinstance(text.get(key), int):
            return int(text[key])
    return None


def safetensors_parameters(folder: Path, quantization: dict[str, Any] | None = None) -> tuple[int, int]:
    """(parameters, bytes) from the safetensors headers of `folder`, reading no tensor data;
    `quantization`: a quantized model's config section (its uint32 words hold 32 / bits
    weights, with per-module bits where the section names the module)."""
    quant = quantization or {}
    params = nbytes = 0
    for path in sorted(folder.glob("*.safetensors")):
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            nbytes += info["data_offsets"][1] - info["data_offsets"][0]
            quantizes = name.rsplit(".", 1)[0] + ".weight" in header
            if name.endswith((".scales", ".biases")) and info["dtype"] != "U32" and quantizes:
                continue  # a quantized weight's scales and biases are not parameters
            count = 1
            for d in info["shape"]:
                count *= int(d)
            if info["dtype"] == "U32" and quant:
                module = quant.get(name.rsplit(".", 1)[0])
                bits = int(module["bits"]) if isinstance(module, dict) else int(quant["bits"])
                count *= 32 // bits
            params += count
    return params, nbytes


def fit_folder(folder: Path, budget_bytes: int, serve_float32: bool) -> Fit:
    """A model folder's fit; `serve_float32`: the weights are served dequantized to float32
    (what a CPU gets by default: engine.model.loader's --dequantize auto)."""
    config = json.loads((folder / "config.json").read_text())
    params, nbytes = safetensors_parameters(folder, config.get("quantization"))
    dtype = 4 if serve_float32 else CONFIG_DTYPE_BYTES.get(str(config.get("torch_dtype", "")), 2)
    weights = params * 4 if serve_float32 else nbytes
    return Fit(
        str(folder), params, weights, kv_bytes_per_token(config, dtype), max_position(config), budget_bytes
    )


def fit_gguf(path: Path, budget_bytes: int, serve_float32: bool) -> Fit:
    """A GGUF file's fit, from its metadata and tensor table."""
    from mlx_serve.engine.gguf.arch import model_config
    from mlx_serve.engine.gguf.reader import read_gguf

    gguf = read_gguf(path)
    config = model_config(gguf)
    params = sum(_count(t.shape) for t in gguf.tensors.values())
    dtype = 4 if serve_float32 else 2
    weights = params * 4 if serve_float32 else path.stat().st_size
    return Fit(
        str(path), params, weights, kv_bytes_per_token(config, dtype), max_position(config), budget_bytes
    )


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
