"""Read the pixels of a PNG (8-bit RGB or RGBA, not interlaced: what Chromium's screenshots are),
with the standard library only, so a test can check what a screenshot shows."""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {2: 3, 6: 4}  # colour type: RGB, RGBA


@dataclass(frozen=True, slots=True)
class Image:
    width: int
    height: int
    channels: int
    rows: list[bytes]

    def pixel(self, x: int, y: int) -> bytes:
        return self.rows[y][x * self.channels : x * self.channels + 3]

    def colours(self, left: int, top: int, right: int, bottom: int, step: int = 2) -> dict[bytes, int]:
        """How many sampled pixels of the box have each RGB colour."""
        seen: dict[bytes, int] = {}
        for y in range(max(0, top), min(self.height, bottom), step):
            for x in range(max(0, left), min(self.width, right), step):
                colour = self.pixel(x, y)
                seen[colour] = seen.get(colour, 0) + 1
        return seen


def read_png(data: bytes) -> Image:
    assert data[:8] == SIGNATURE, "not a PNG"
    pos, chunks, header = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour_type in CHANNELS and interlace == 0, (depth, colour_type, interlace)
    channels = CHANNELS[colour_type]
    raw = zlib.decompress(b"".join(chunks))
    return Image(width, height, channels, _unfilter(raw, width * channels, height, channels))


def _unfilter(raw: bytes, stride: int, height: int, bpp: int) -> list[bytes]:
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up, corner = previous[i], previous[i - bpp] if i >= bpp else 0
            line[i] = (line[i] + _predict(kind, left, up, corner)) & 0xFF
        rows.append(bytes(line))
        previous = line
    return rows


def _predict(kind: int, left: int, up: int, corner: int) -> int:
    if kind == 0:
        return 0
    if kind == 1:
        return left
    if kind == 2:
        return up
    if kind == 3:
        return (left + up) // 2
    p = left + up - corner  # Paeth
    pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
    return left if pa <= pb and pa <= pc else up if pb <= pc else corner
