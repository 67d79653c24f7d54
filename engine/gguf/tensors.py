"""GGUF tensor payloads as arrays MLX can load.

Q4_0, Q4_1, Q5_0, Q8_0 and Q4_K blocks are exactly MLX affine quantization with group size 32
(w = scale * q + bias; Q4_K's 32-weight sub-blocks each have their own scale and minimum), so
they are repacked bit for bit, never dequantized. Every other type (Q6_K's groups of 16, the
other K-quants, F16, BF16) is dequantized to float32. Scales and biases are float32 as well:
float16 ones make MLX's quantized matmul crawl on a CPU (MODELS.md), and float32 keeps the
repacking lossless (each scale and bias is a product of a float16 and a small integer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import Q4_K, dequantize

from mlx_serve.engine.gguf.reader import GGUFFile

GROUP_SIZE = 32  # every block type kept quantized here holds 32 weights per block


@dataclass(frozen=True, slots=True)
class QuantizedTensor:
    """An MLX affine-quantized matrix: uint32-packed `weight`, float32 `scales` and `biases`."""

    weight: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int


Tensor = np.ndarray | QuantizedTensor


def load_tensor(gguf: GGUFFile, name: str) -> Tensor:
    """Tensor `name` of the file: repacked if MLX has its block format, else float32."""
    ggml_type = gguf.tensors[name].ggml_type
    raw = gguf.raw(name)
    repack = _repacker(ggml_type)
    if repack is not None and raw.ndim == 2:
        return repack(raw)
    return np.ascontiguousarray(dequantize(raw, ggml_type), dtype=np.float32)


def map_rows(tensor: Tensor, fn: Callable[[np.ndarray], np.ndarray]) -> Tensor:
    """Apply a row-wise transform to a plain tensor, or to each part of a quantized one.

    Packing and groups run along columns, so a permutation of rows commutes with quantization.
    """
    if isinstance(tensor, QuantizedTensor):
        return QuantizedTensor(fn(tensor.weight), fn(tensor.scales), fn(tensor.biases), tensor.bits)
    return fn(tensor)


def unpermute_rope_rows(rows: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: per head it stores (half, 2) where HF and MLX use (2, half)."""
    half = rows.shape[0] // n_heads // 2
    grouped = rows.reshape(n_heads, half, 2, *rows.shape[1:])
    return np.ascontiguousarray(grouped.swapaxes(1, 2).reshape(rows.shape))


def _blocks(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    """(rows, row bytes) -> (rows, blocks per row, block bytes)."""
    return raw.reshape(raw.shape[0], -1, block_bytes)


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """A float16 field of every block, widened to float32: shape (rows, blocks)."""
    field = np.ascontiguousarray(blocks[..., start : start + 2])
    return field.view(np.float16)[..., 0].astype(np.float32)


def _pack_nibbles(ggml_qs: np.ndarray) -> np.ndarray:
    """ggml keeps weight j in the low nibble of byte j and weight j+16 in its high nibble;
    MLX packs weights in order, two per byte, low nibble first."""
    ordered = np.concatenate([ggml_qs & 0x0F, ggml_qs >> 4], axis=-1)
    packed = ordered[..., 0::2] | (ordered[..., 1::2] << 4)
    return _as_words(packed)


def _pack_5bit(values: np.ndarray) -> np.ndarray:
    """(rows, n) uint8 values below 32, n a multiple of 8 -> MLX's 5-bit words: a little-endian
    bit stream, 8 values in every 5 bytes."""
    v = [values[:, k::8] for k in range(8)]
    stream = np.stack(
        [
            v[0] | (v[1] << 5),
            (v[1] >> 3) | (v[2] << 2) | (v[3] << 7),
            (v[3] >> 1) | (v[4] << 4),
            (v[4] >> 4) | (v[5] << 1) | (v[6] << 6),
            (v[6] >> 2) | (v[7] << 3),
        ],
        axis=-1,
    )
    return _as_words(stream)


def _as_words(packed: np.ndarray) -> np.ndarray:
    """(rows, blocks, bytes) uint8 -> (rows, words) uint32, little-endian like MLX."""
    flat = np.ascontiguousarray(packed, dtype=np.uint8).reshape(packed.shape[0], -1)
    return flat.view("<u4")


def _repack_q4_0(raw: np.ndarray) -> QuantizedTensor:
    blocks = _blocks(raw, 18)
    scale = _half(blocks, 0)
    # q4_0 stores w = d * (q - 8)
    return QuantizedTensor(_pack_nibbles(blocks[..., 2:]), scale, -8.0 * scale, 4)


def _repack_q4_1(raw: np.ndarray) -> QuantizedTensor:
    blocks = _blocks(raw, 20)
    # q4_1 stores w = d * q + m
    return QuantizedTensor(_pack_nibbles(blocks[..., 4:]), _half(blocks, 0), _half(blocks, 2), 4)


def _repack_q5_0(raw: np.ndarray) -> QuantizedTensor:
    blocks = _blocks(raw, 22)
    scale = _half(blocks, 0)
    # weight j: low nibble as in q4_0, fifth bit = bit j of the little-endian word qh
    high = np.unpackbits(blocks[..., 2:6], axis=-1, bitorder="little")
    low = np.concatenate([blocks[..., 6:] & 0x0F, blocks[..., 6:] >> 4], axis=-1)
    values = (low | (high << 4)).reshape(raw.shape[0], -1)
    # q5_0 stores w = d * (q - 16)
    return QuantizedTensor(_pack_5bit(values), scale, -16.0 * scale, 5)


def _repack_q4_k(raw: np.ndarray) -> QuantizedTensor:
    blocks = _blocks(raw, 144)
    rows, n_blocks = blocks.shape[:2]
    # q4_k: 256 weights in 8 sub-blocks of 32, w = d * sc_j * q - dmin * m_j (6-bit sc_j, m_j)
    sc, m = Q4_K.get_scale_min(np.ascontiguousarray(blocks[..., 4:16]).reshape(-1, 12))
    scales = _half(blocks, 0)[..., None] * sc.reshape(rows, n_blocks, 8).astype(np.float32)
    biases = -(_half(blocks, 2)[..., None] * m.reshape(rows, n_blocks, 8).astype(np.float32))
    # each 32 bytes of qs hold two sub-blocks: the low nibbles, then the high ones
    chunks = blocks[..., 16:].reshape(rows, n_blocks * 4, 32)
    return QuantizedTensor(_pack_nibbles(chunks), scales.reshape(rows, -1), biases.reshape(rows, -1), 4)


def _repack_q8_0(raw: np.ndarray) -> QuantizedTensor:
    blocks = _blocks(raw, 34)
    scale = _half(blocks, 0)
    # q8_0 stores w = d * q with signed q; flipping the sign bit gives q + 128 unsigned
    unsigned = blocks[..., 2:] ^ np.uint8(0x80)
    return QuantizedTensor(_as_words(unsigned), scale, -128.0 * scale, 8)


def _repacker(ggml_type: GGMLQuantizationType) -> Callable[[np.ndarray], QuantizedTensor] | None:
    match ggml_type:
        case GGMLQuantizationType.Q4_0:
            return _repack_q4_0
        case GGMLQuantizationType.Q4_1:
            return _repack_q4_1
        case GGMLQuantizationType.Q5_0:
            return _repack_q5_0
        case GGMLQuantizationType.Q8_0:
            return _repack_q8_0
        case GGMLQuantizationType.Q4_K:
            return _repack_q4_k
    return None
