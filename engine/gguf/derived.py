"""Folders the server derives from model files and keeps in its cache: GGUF conversions
(engine.gguf.convert) and float32 copies (engine.model.dequantized).

Each names the file or folder it was made from (SOURCE_FILE), and is keyed by that source's
identity, so a changed source gets a new folder. Writing one deletes its siblings whose source is
gone or has changed since (a re-installed package, a model served from a temporary folder, a newer
converter): each would otherwise stay on disk for good. Folders that name no source are left alone.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("mlx_serve.engine")

SOURCE_FILE = "mlx-serve-source.json"


def name_source(folder: Path, source: Path) -> None:
    (folder / SOURCE_FILE).write_text(json.dumps({"source": str(source)}))


def evict_stale(keep: Path, folder_now: Callable[[Path], Path | None], what: str) -> None:
    """Delete the siblings of `keep` whose source is gone or now has another folder
    (`folder_now(source)`: where its derived folder would be today; None: the source is gone)."""
    for other in keep.parent.iterdir():
        if other == keep or other.name.startswith(".") or not (other / SOURCE_FILE).is_file():
            continue
        try:
            source = Path(json.loads((other / SOURCE_FILE).read_text())["source"])
            stale = folder_now(source) != other
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if stale:
            shutil.rmtree(other, ignore_errors=True)
            log.info("deleted %s %s: its source %s is gone or has changed", what, other, source)
