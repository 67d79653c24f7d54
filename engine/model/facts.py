"""What a model listing says of a model, from its files alone: its size on disk, its parameter
count and how its weights are stored (Ollama's /api/tags and /api/show read these).

Read once when the engine has loaded the model, from the folder or GGUF file it was loaded from
(the safetensors headers or the GGUF tensor table: no tensor data is read).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mlx_serve.engine.model.fit import safetensors_parameters

# llama.cpp's file types (general.file_type), by the names Ollama reports as quantization_level.
GGUF_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
}  # fmt: skip
TORCH_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """A model as its files describe it."""

    file_bytes: int  # the weights' files on disk
    parameters: int
    quantization: str  # "Q4_K_M", "BF16", MLX's "Q4" (4-bit, any group size); "" when unknown
    # Filled in by the engine once loaded: the weights in memory plus the KV of one full
    # context (the memory plan's), and whether that memory is a GPU's (Metal, CUDA).
    memory_bytes: int = 0
    on_gpu: bool = False

    @property
    def parameter_size(self) -> str:
        """The count as Ollama writes it: "135M", "494.03M", "1.5B", "8B"."""
        return parameter_size(self.parameters)


def parameter_size(n: int) -> str:
    for unit, scale, digits in (("B", 1e9, 1), ("M", 1e6, 2), ("K", 1e3, 0)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{digits}f}{unit}"
    return str(n)


def model_facts(path: Path) -> ModelFacts | None:
    """The facts of a model folder (config.json and safetensors) or GGUF file; None for files
    this does not know how to read."""
    try:
        if path.is_file() and path.suffix == ".gguf":
            return _gguf(path)
        if (path / "config.json").exists():
            return _folder(path)
    except (OSError, ValueError, KeyError):  # a listing's facts are never worth a failed load
        return None
    return None


def _folder(folder: Path) -> ModelFacts:
    config = json.loads((folder / "config.json").read_text())
    quant = config.get("quantization") or config.get("quantization_config")
    params, _ = safetensors_parameters(folder, quant if isinstance(quant, dict) and "bits" in quant else None)
    files = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    if isinstance(quant, dict) and "bits" in quant:
        level = f"Q{int(quant['bits'])}"
    else:
        text = config.get("text_config") or config
        level = TORCH_DTYPES.get(str(text.get("torch_dtype") or config.get("torch_dtype") or ""), "")
    return ModelFacts(files, params, level)


def _gguf(path: Path) -> ModelFacts:
    from mlx_serve.engine.gguf.reader import read_gguf

    gguf = read_gguf(path)
    params = 0
    for tensor in gguf.tensors.values():
        count = 1
        for d in tensor.shape:
            count *= int(d)
        params += count
    kind = gguf.metadata.get("general.file_type")
    level = GGUF_FILE_TYPES.get(int(kind), "") if isinstance(kind, int) else ""
    return ModelFacts(path.stat().st_size, params, level)
