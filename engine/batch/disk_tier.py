"""The prefix cache's second tier: blocks evicted from memory, on disk, across restarts.

One safetensors file a block, named by its key, in a folder named by the model's fingerprint
(weights, dtype, KV layout, block size), so another model's blocks are never looked at. A file
carries its parent's key and its tokens in its metadata; a read checks them and the arrays'
shapes, and a file that fails (corrupt, truncated, foreign, stale) is removed and counted a
miss, never served. Writes run on a thread of their own, off the step's path; a block waiting
to be written is served from memory. A full disk (ENOSPC) turns the tier off with one log line.
The folder is capped at `max_bytes`: the oldest files go first.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import queue
import threading
import time
from array import array
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, cast

import mlx.core as mx

if TYPE_CHECKING:
    from mlx_serve.engine.model.mlx_boundary import Model

log = logging.getLogger("mlx_serve.engine")

SUFFIX = ".safetensors"
CLOSE_WRITE_S = 10.0  # a clean stop writes what is queued for this long (within a service's 15 s stop margin)
MAX_PENDING_BYTES = 1 << 30  # evicted blocks waiting for the writer; past it, a spill is skipped
FORMAT = "1"
TMP_PREFIX = "writing-"


def default_dir() -> Path:
    """Under the server's cache folder ($MLX_SERVE_CACHE, else ~/.cache/mlx-serve)."""
    from mlx_serve.engine.model.loader import cache_root

    return Path(cache_root()) / "prompt-cache"


def fingerprint(model: Model, block_tokens: int) -> str:
    """The model's identity for its blocks on disk: every parameter's name, shape and dtype, a
    sample of its values (its first 16, 16 spread over it, and the sum of all of them — one pass
    over the weights on the accelerator — so two fine-tunes or adapters that differ anywhere differ
    here), the KV layout and the block size."""
    from mlx.utils import tree_flatten

    from mlx_serve.engine.model.mlx_boundary import make_prompt_cache

    h = hashlib.blake2b(f"{FORMAT}:{block_tokens}".encode(), digest_size=12)
    params = cast("list[tuple[str, mx.array]]", tree_flatten(model.parameters()))
    samples = [_sample(p) for _, p in params]
    mx.eval(samples)
    for (name, p), sample in zip(params, samples):
        h.update(f"{name}{p.shape}{p.dtype}".encode())
        h.update(repr(sample.tolist()).encode())
    h.update(" ".join(type(c).__name__ for c in make_prompt_cache(model)).encode())
    return h.hexdigest()


def _sample(p: mx.array) -> mx.array:
    flat = p.reshape(-1)
    spread = flat[:: max(1, flat.size // 16)][:16]
    total = mx.sum(flat.astype(mx.float32), keepdims=True)
    return mx.concatenate([flat[:16].astype(mx.float32), spread.astype(mx.float32), total])


class DiskTier:
    """Blocks on disk for one model. put() from the engine's owner thread; get() too."""

    def __init__(self, folder: Path, max_bytes: int) -> None:
        self.folder = folder
        self.max_bytes = max_bytes
        self.enabled = True
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, int] = OrderedDict()  # key -> file bytes, oldest first
        self._pending: dict[bytes, tuple[list[mx.array], list[mx.array]]] = {}
        self._pending_bytes = 0
        self._stop_by = float("inf")  # close(): writes after this are dropped
        self._queue: queue.SimpleQueue[tuple[bytes, dict[str, mx.array], dict[str, str]] | None] = (
            queue.SimpleQueue()
        )
        folder.mkdir(parents=True, exist_ok=True)
        self._scan()
        self._writer = threading.Thread(target=self._write_loop, name="prompt-cache-writer", daemon=True)
        self._writer.start()

    @property
    def nbytes(self) -> int:
        return sum(self._index.values())

    def __len__(self) -> int:
        return len(self._index)

    def _scan(self) -> None:
        files = []
        for p in self.folder.iterdir():
            if p.name.startswith(TMP_PREFIX):
                p.unlink(missing_ok=True)  # a write cut short by a crash
            elif p.name.endswith(SUFFIX):
                try:
                    key, st = bytes.fromhex(p.name[: -len(SUFFIX)]), p.stat()
                except (ValueError, OSError):
                    p.unlink(missing_ok=True)
                    continue
                files.append((st.st_mtime, key, st.st_size))
        for _, key, size in sorted(files):
            self._index[key] = size
        self._trim()

    def _path(self, key: bytes) -> Path:
        return self.folder / (key.hex() + SUFFIX)

    # -- write ------------------------------------------------------------------------

    def put(
        self,
        key: bytes,
        parent: bytes,
        tokens: tuple[int, ...],
        keys: list[mx.array],
        values: list[mx.array],
        held: bool,
    ) -> None:
        """Queue a full block for writing. One memory still `held` costs no memory to queue; an
        evicted one is skipped when the writer is MAX_PENDING_BYTES behind."""
        nbytes = sum(a.nbytes for a in keys) + sum(a.nbytes for a in values)
        if not self.enabled or key in self._index or key in self._pending:
            return
        if not held and self._pending_bytes + nbytes > MAX_PENDING_BYTES:
            return
        arrays = {f"k{i}": k for i, k in enumerate(keys)} | {f"v{i}": v for i, v in enumerate(values)}
        mx.eval(list(arrays.values()))
        meta = {"format": FORMAT, "parent": parent.hex(), "tokens": _tokens_hex(tokens)}
        with self._lock:
            self._pending[key] = (keys, values)
            self._pending_bytes += nbytes
        self._queue.put((key, arrays, meta))

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            key, arrays, meta = item
            try:
                self._write(key, arrays, meta)
            except Exception:  # the tier is an optimisation: a bad write is dropped, serving goes on
                log.exception("prompt cache: writing a block to %s failed", self.folder)
            finally:
                with self._lock:
                    if self._pending.pop(key, None) is not None:
                        self._pending_bytes -= sum(a.nbytes for a in arrays.values())

    def _write(self, key: bytes, arrays: dict[str, mx.array], meta: dict[str, str]) -> None:
        if not self.enabled or time.monotonic() > self._stop_by:
            return
        path = self._path(key)
        tmp = path.with_name(TMP_PREFIX + path.name)  # mx.save_safetensors wants the suffix
        try:
            mx.save_safetensors(str(tmp), arrays, metadata=meta)
            os.replace(tmp, path)
            size = path.stat().st_size
        except (OSError, RuntimeError, ValueError) as exc:
            tmp.unlink(missing_ok=True)
            if _no_space(exc):
                self.enabled = False
                log.warning("prompt cache: the disk at %s is full; the disk tier is off", self.folder)
                return
            raise
        with self._lock:
            self._index[key] = size
            self._trim()

    def _trim(self) -> None:
        total = sum(self._index.values())
        while self._index and total > self.max_bytes:
            key, size = self._index.popitem(last=False)
            self._path(key).unlink(missing_ok=True)
            total -= size

    def close(self) -> None:
        """Write what is queued (for CLOSE_WRITE_S at most), then stop the writer (the tier is off
        from then on)."""
        if self._writer.is_alive():
            self._stop_by = time.monotonic() + CLOSE_WRITE_S
            self._queue.put(None)
            self._writer.join()
        self.enabled = False

    # -- read -------------------------------------------------------------------------

    def get(
        self, key: bytes, parent: bytes, tokens: tuple[int, ...]
    ) -> tuple[list[mx.array], list[mx.array]] | None:
        """The block's keys and values per layer if a sound file (or a queued write) holds it."""
        with self._lock:
            pending = self._pending.get(key)
            known = key in self._index
        if pending is not None:
            return pending
        if not known:
            return None
        arrays = self._read(key, parent, tokens)
        if arrays is None:
            with self._lock:
                self._index.pop(key, None)
            self._path(key).unlink(missing_ok=True)
        return arrays

    def _read(
        self, key: bytes, parent: bytes, tokens: tuple[int, ...]
    ) -> tuple[list[mx.array], list[mx.array]] | None:
        try:
            loaded = mx.load(str(self._path(key)), return_metadata=True)
            data, meta = cast("tuple[dict[str, mx.array], dict[str, str]]", loaded)
            layers = len(data) // 2
            keys = [data[f"k{i}"] for i in range(layers)]
            values = [data[f"v{i}"] for i in range(layers)]
            mx.eval(keys, values)
        except Exception as exc:  # noqa: BLE001 - an unreadable file is a miss, and removed
            log.info("prompt cache: %s unreadable (%s); removed", self._path(key).name, exc)
            return None
        sound = (
            meta.get("format") == FORMAT
            and meta.get("parent") == parent.hex()
            and meta.get("tokens") == _tokens_hex(tokens)
            and layers > 0
            and len(data) == 2 * layers
            and all(int(a.shape[2]) == len(tokens) for a in keys + values if a.ndim == 4)
            and all(a.ndim == 4 for a in keys + values)
        )
        if not sound:
            log.info("prompt cache: %s holds another block; removed", self._path(key).name)
            return None
        return keys, values


def _tokens_hex(tokens: tuple[int, ...]) -> str:
    return array("q", tokens).tobytes().hex()


def _no_space(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return "No space left" in str(exc)
