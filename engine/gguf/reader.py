"""Read a GGUF file's header: metadata, tensor table, and raw tensor bytes on demand.

A small reader of our own, because `gguf.GGUFReader` builds a numpy view per string and takes
~20 s on a 262k-token vocabulary; this one walks the header with `struct` in well under a second.
Tensor data stays in a read-only memory map until a tensor is asked for.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32  # llama.cpp's default when general.alignment is absent

# Metadata value types with a fixed width: GGUF type id -> struct format (little-endian).
_SCALAR_FORMATS: MappingProxyType[int, str] = MappingProxyType({
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i",
    6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d",
})  # fmt: skip
_NUMPY_DTYPES: MappingProxyType[int, str] = MappingProxyType({
    0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4",
    6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8",
})  # fmt: skip
_STRING = 8
_ARRAY = 9


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor's entry in the table; `shape` is numpy order (rows last-but-one, columns last)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    offset: int

    @property
    def nbytes(self) -> int:
        block_elements, block_bytes = GGML_QUANT_SIZES[self.ggml_type]
        return int(np.prod(self.shape)) // block_elements * block_bytes


@dataclass(frozen=True, slots=True)
class GGUFFile:
    """A parsed header. Numeric arrays are numpy arrays, string arrays are lists of str."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    data_start: int

    @property
    def architecture(self) -> str:
        return str(self.metadata["general.architecture"])

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as uint8 rows: shape (rows..., bytes per row), memory-mapped."""
        info = self.tensors[name]
        start = self.data_start + info.offset
        blob = np.memmap(self.path, mode="r", dtype=np.uint8, offset=start, shape=(info.nbytes,))
        return blob.reshape(*info.shape[:-1], -1)


@dataclass(slots=True)
class _Cursor:
    """A position in the header bytes; every read advances it."""

    blob: mmap.mmap
    pos: int = 0

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.blob, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        start, self.pos = self.pos, self.pos + length
        # errors="replace": a few vocabularies hold invalid UTF-8 pieces; keep the ids aligned
        return self.blob[start : self.pos].decode("utf-8", errors="replace")

    def value(self, value_type: int) -> Any:
        if value_type in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            return self.array()
        raise GGUFFormatError(f"unknown GGUF metadata value type {value_type}")

    def array(self) -> Any:
        element_type = self.unpack("<I")
        count = self.unpack("<Q")
        if element_type in _NUMPY_DTYPES:
            dtype = np.dtype(_NUMPY_DTYPES[element_type])
            values = np.frombuffer(self.blob, dtype=dtype, count=count, offset=self.pos)
            self.pos += count * dtype.itemsize
            return values.copy()
        return [self.value(element_type) for _ in range(count)]


def read_gguf(path: str | Path) -> GGUFFile:
    """Parse the header of the GGUF file at `path` (metadata and tensor table, no tensor data)."""
    path = Path(path)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        return _parse(path, _Cursor(blob))


def _parse(path: Path, cursor: _Cursor) -> GGUFFile:
    if cursor.blob[:4] != GGUF_MAGIC:
        raise GGUFFormatError(f"{path} is not a GGUF file (bad magic)")
    cursor.pos = 4
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"{path}: GGUF version {version} is not supported (2 or 3)")
    tensor_count = cursor.unpack("<Q")
    kv_count = cursor.unpack("<Q")
    metadata = {cursor.string(): cursor.value(cursor.unpack("<I")) for _ in range(kv_count)}
    tensors = [_tensor_info(cursor) for _ in range(tensor_count)]
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cursor.pos // alignment) * alignment
    return GGUFFile(path, metadata, {t.name: t for t in tensors}, data_start)


def _tensor_info(cursor: _Cursor) -> TensorInfo:
    name = cursor.string()
    n_dims = cursor.unpack("<I")
    dims = [cursor.unpack("<Q") for _ in range(n_dims)]
    ggml_type = GGMLQuantizationType(cursor.unpack("<I"))
    offset = cursor.unpack("<Q")
    # ggml lists the fastest-moving dimension first; numpy wants it last
    return TensorInfo(name, tuple(reversed(dims)), ggml_type, offset)
