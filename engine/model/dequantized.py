"""A quantized model's float32 copy on disk, so that dequantizing is paid once, not per start.

On a CPU the engine serves quantized weights as float32 (engine.model.loader.maybe_dequantize), and
MLX's CPU dequantize is slow: 2.2 s for SmolLM2-135M's 4-bit weights on 2 cores, far longer for
the 5-bit ones of Qwen2.5-Coder — every start, in series before the engine is ready. The first
dequantized load writes the weights as a plain (unquantized) model folder under
`<cache>/float32/`; later loads read that instead. The copy is keyed by the source folder's path
and its config and weight files (name, size, modification time), so a changed model gets a new
copy. It costs disk: four bytes a weight (SmolLM2 0.5 GB, Qwen2.5-Coder-1.5B 6 GB); delete the
folder to reclaim it. A copy is written only while the disk keeps at least as much again free
(and FREE_MARGIN_BYTES); one that cannot be written is only logged. Each copy names its source
(engine.gguf.derived); writing a copy deletes the copies of that same source made before it changed and
those whose source folder is gone, so a model re-converted, or one served from a temporary
folder, does not leave gigabytes behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, cast

from mlx_serve.engine.gguf.derived import evict_stale, name_source

log = logging.getLogger("mlx_serve.loader")

WEIGHT_SUFFIX = ".safetensors"
SKIPPED = frozenset({"config.json", "model.safetensors.index.json"})
FREE_MARGIN_BYTES = 2 << 30


def copy_folder(source: Path, root: Path) -> Path:
    """Where the float32 copy of the model folder `source` lives (or would)."""
    key = hashlib.sha256(str(source.resolve()).encode())
    for f in sorted(source.iterdir()):
        if f.name == "config.json" or f.suffix == WEIGHT_SUFFIX:
            stat = f.stat()
            key.update(f"{f.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return root / "float32" / f"{source.name}-{key.hexdigest()[:16]}"


def save_copy(model: Any, source: Path, target: Path) -> None:
    """Write the dequantized `model` as a plain model folder at `target` (atomically)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    scratch: Path | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        weights = dict(cast("list[tuple[str, mx.array]]", tree_flatten(model.parameters())))
        size = sum(v.nbytes for v in weights.values())
        free = shutil.disk_usage(target.parent).free
        if free < 2 * size + FREE_MARGIN_BYTES:
            log.info("not keeping a float32 copy (%.1f GB) with %.1f GB free on disk", size / 1e9, free / 1e9)
            return
        scratch = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
        mx.save_safetensors(str(scratch / f"model{WEIGHT_SUFFIX}"), weights)
        config = json.loads((source / "config.json").read_text())
        config.pop("quantization", None)
        config.pop("quantization_config", None)
        (scratch / "config.json").write_text(json.dumps(config, indent=1))
        for f in source.iterdir():
            if f.is_file() and f.suffix != WEIGHT_SUFFIX and f.name not in SKIPPED:
                shutil.copy2(f, scratch / f.name)
        name_source(scratch, source.resolve())
        evict_stale(
            target, lambda s: copy_folder(s, target.parent.parent) if s.is_dir() else None, "the float32 copy"
        )
        os.replace(scratch, target)
        log.info("wrote the float32 weights to %s: later starts load them as they are", target)
    except OSError as exc:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if not target.is_dir():  # (another process writing the same copy first is fine)
            log.warning(
                "could not keep the float32 weights in %s (%s): each start dequantizes again", target, exc
            )
