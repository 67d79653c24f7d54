"""Turn a GGUF file (llama.cpp's format) into a folder `mlx_lm.utils.load()` reads.

The folder holds config.json, model*.safetensors, tokenizer.json and tokenizer_config.json. It
is built once per file version under `<cache_root>/gguf/<stem>-<key>` and reused after that:
the key hashes the file's resolved path, size and mtime with CONVERTER_VERSION, so an edited
file or a changed converter gets a fresh folder. A folder is built beside its final place and
renamed into it, so a crash never leaves a half-written folder that looks finished.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from mlx_serve.engine.gguf.arch import Architecture, architecture_for, model_config
from mlx_serve.engine.gguf.derived import evict_stale, name_source
from mlx_serve.engine.gguf.reader import GGUFFile, read_gguf
from mlx_serve.engine.gguf.tensors import (
    GROUP_SIZE,
    QuantizedTensor,
    Tensor,
    load_tensor,
    map_rows,
    unpermute_rope_rows,
)
from mlx_serve.engine.gguf.tokenizer import write_tokenizer
from mlx_serve.engine.gguf.vocab import eos_token_ids

# Bump whenever the folder's contents would change for the same GGUF file.
CONVERTER_VERSION = 4
CACHE_ENV = "MLX_SERVE_CACHE"
SHARD_BYTES = 1 << 30

Progress = Callable[[str], None]
log = logging.getLogger("mlx_serve.gguf")


def convert_gguf(path: str | Path, cache_root: Path | None = None, progress: Progress | None = None) -> Path:
    """Convert a GGUF file into a folder that mlx_lm.utils.load() can load, and return it.

    Cached under cache_root (default: $MLX_SERVE_CACHE or ~/.cache/mlx-serve)/gguf/<key>; a
    second call for an unchanged file returns the cached folder without reading tensors.
    Raises ValueError for an architecture, tensor or tokenizer this converter does not know.
    """
    source = Path(path).resolve()
    folder = cache_folder(source, cache_root)
    if (folder / "config.json").is_file():
        return folder
    notify = progress or _ignore
    notify(f"converting {source.name} to MLX in {folder}")
    gguf = read_gguf(source)
    arch, config = _checked_architecture(gguf)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache is as readable as any download
    try:
        name_source(staging, source)
        _write_model(gguf, arch, config, staging, notify)
        _publish(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    notify(f"converted {source.name}")
    evict_stale(
        folder, lambda s: cache_folder(s, folder.parent.parent) if s.is_file() else None, "the conversion"
    )
    return folder


def cache_folder(source: Path, cache_root: Path | None = None) -> Path:
    """Where the conversion of `source` (a resolved path) lives."""
    root = cache_root or Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "mlx-serve")
    stat = source.stat()
    identity = f"{CONVERTER_VERSION}\n{source}\n{stat.st_size}\n{stat.st_mtime_ns}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return root / "gguf" / f"{source.stem}-{key}"


def _ignore(message: str) -> None:
    pass


def _checked_architecture(gguf: GGUFFile) -> tuple[Architecture, dict[str, Any]]:
    """The architecture and config.json of a file; fails before any slow work when the file
    holds something this converter cannot read whole."""
    if int(gguf.metadata.get("split.count", 1)) > 1:
        raise ValueError(
            f"{gguf.path.name} is one part of a split GGUF; merge it with llama-gguf-split first"
        )
    arch = architecture_for(gguf)
    config = model_config(gguf)
    for name in gguf.tensors:
        arch.mlx_name(name)
    return arch, config


def _publish(staging: Path, folder: Path) -> None:
    try:
        staging.rename(folder)
    except OSError:
        # another process finished the same conversion first: keep its folder
        if not (folder / "config.json").is_file():
            raise


def _write_model(
    gguf: GGUFFile, arch: Architecture, config: dict[str, Any], folder: Path, notify: Progress
) -> None:
    vocab = write_tokenizer(gguf, folder, config["max_position_embeddings"])
    notify(f"tokenizer written ({len(vocab.tokens)} tokens)")
    eos = eos_token_ids(vocab)
    config["bos_token_id"] = vocab.bos_id
    config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    bits = _write_weights(gguf, arch, config, folder, notify)
    if (quantization := quantization_config(bits)) is not None:
        config["quantization"] = quantization
    # written last: its presence marks the folder complete
    (folder / "config.json").write_text(json.dumps(config, indent=2))


# --- weights ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _ShardWriter:
    """Collects converted arrays and writes a safetensors shard whenever SHARD_BYTES fill up."""

    folder: Path
    pending: dict[str, mx.array] = field(default_factory=dict)
    pending_bytes: int = 0
    files: list[Path] = field(default_factory=list)
    weight_map: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, array: np.ndarray) -> None:
        self.pending[name] = mx.array(array)
        self.pending_bytes += array.nbytes
        if self.pending_bytes >= SHARD_BYTES:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        path = self.folder / f"model-{len(self.files) + 1:05d}.safetensors"
        mx.save_safetensors(str(path), self.pending, metadata={"format": "mlx"})
        self.weight_map.update(dict.fromkeys(self.pending, path.name))
        self.files.append(path)
        self.pending, self.pending_bytes = {}, 0

    def finish(self) -> None:
        """Name the shards the Hugging Face way, with an index when there are several."""
        self.flush()
        if len(self.files) == 1:
            self.files[0].rename(self.folder / "model.safetensors")
            return
        renames = {
            p.name: f"model-{i:05d}-of-{len(self.files):05d}.safetensors" for i, p in enumerate(self.files, 1)
        }
        for old, new in renames.items():
            (self.folder / old).rename(self.folder / new)
        index = {"metadata": {}, "weight_map": {k: renames[v] for k, v in self.weight_map.items()}}
        (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _write_weights(
    gguf: GGUFFile, arch: Architecture, config: dict[str, Any], folder: Path, notify: Progress
) -> dict[str, int | None]:
    """Convert and write every tensor; return the bits of each matrix module (None: float)."""
    writer = _ShardWriter(folder)
    bits: dict[str, int | None] = {}
    for done, (name, tensor) in enumerate(_converted_tensors(gguf, arch, config), 1):
        module = name.removesuffix(".weight")
        if isinstance(tensor, QuantizedTensor):
            bits[module] = tensor.bits
            for part in ("weight", "scales", "biases"):
                writer.add(f"{module}.{part}", getattr(tensor, part))
        else:
            if tensor.ndim == 2 and name.endswith(".weight"):
                bits[module] = None
            writer.add(name, tensor)
        if done % 50 == 0:
            notify(f"converted {done}/{len(gguf.tensors)} tensors")
    writer.finish()
    return bits


def _converted_tensors(
    gguf: GGUFFile, arch: Architecture, config: dict[str, Any]
) -> Iterator[tuple[str, Tensor]]:
    """(mlx-lm name, tensor) for each GGUF tensor, with the architecture's fix-ups applied."""
    rope_heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for gguf_name in gguf.tensors:
        tensor = load_tensor(gguf, gguf_name)
        if arch.norm_offset and arch.is_norm(gguf_name):
            tensor = np.asarray(tensor, dtype=np.float32) - np.float32(arch.norm_offset)
        if arch.unpermute_qk and (heads := rope_heads.get(gguf_name.split(".")[-2])):
            tensor = map_rows(tensor, partial(unpermute_rope_rows, n_heads=heads))
        yield arch.mlx_name(gguf_name), tensor


def quantization_config(bits: dict[str, int | None]) -> dict[str, Any] | None:
    """mlx-lm's `quantization` section: the commonest width as default, per-module exceptions."""
    widths = Counter(b for b in bits.values() if b is not None)
    if not widths:
        return None
    default = widths.most_common(1)[0][0]
    section: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": default, "mode": "affine"}
    for module, width in bits.items():
        if width is None:
            section[module] = False
        elif width != default:
            section[module] = {"group_size": GROUP_SIZE, "bits": width, "mode": "affine"}
    return section
