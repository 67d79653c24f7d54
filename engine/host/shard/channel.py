"""Rank 0's decisions, broadcast to every rank through MLX collectives.

A message is pickled (the ranks of one group trust each other, as they trust the weights) and
sent by `all_sum` with zeros from every other rank: one HEADER_BYTES collective holds the length
and the start of the payload, and only a longer message takes a second one for the rest.
Collectives run inside the runner's stream context, the one the model's own collectives use,
so every rank runs all of them in the order it issued them.
"""

from __future__ import annotations

import pickle
import zlib
from dataclasses import dataclass
from typing import Any

from mlx_serve.engine.rows.step_records import StepOutput, StepPlan
from mlx_serve.engine.types import Request

HEADER_BYTES = 4096
LENGTH_BYTES = 8


@dataclass(frozen=True, slots=True)
class Admit:
    """A row rank 0 admitted this step, and the prompt tokens its prefix cache already held."""

    request: Request
    num_cached: int


@dataclass(frozen=True, slots=True)
class Step:
    admits: tuple[Admit, ...]
    plan: StepPlan
    checksum: int | None  # of the previous step's tokens on rank 0 (None: that step failed, or none)


@dataclass(frozen=True, slots=True)
class Reset:
    """Rank 0's runner forgot every row (after a fault): forget them too."""


Message = Step | Reset


def checksum(out: StepOutput) -> int:
    """The step's sampled tokens, by row, as one number every rank can compare."""
    return zlib.crc32(repr(sorted(out.tokens.items())).encode())


class Channel:
    """Rank 0 publishes, every other rank receives the same messages in the same order."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.rank = group.rank()

    def publish(self, message: Message) -> None:
        assert self.rank == 0, "only rank 0 publishes"
        self._broadcast(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    def receive(self) -> Message:
        message: Message = pickle.loads(self._broadcast(None))
        return message

    def _broadcast(self, data: bytes | None) -> bytes:
        room = HEADER_BYTES - LENGTH_BYTES
        head = bytearray(HEADER_BYTES)
        if data is not None:
            start = len(data).to_bytes(LENGTH_BYTES, "little") + data[:room]
            head[: len(start)] = start
        got = self._sum(head)
        n = int.from_bytes(got[:LENGTH_BYTES], "little")
        body = got[LENGTH_BYTES : LENGTH_BYTES + min(n, room)]
        if n <= room:
            return body
        rest = data[room:] if data is not None else bytes(n - room)
        return body + self._sum(rest)

    def _sum(self, buf: bytes | bytearray) -> bytes:
        """Every rank's bytes summed, as bytes (the others send zeros, so: rank 0's bytes)."""
        import mlx.core as mx
        import numpy as np
        from mlx_lm.generate import generation_stream

        with mx.stream(generation_stream):
            out = mx.distributed.all_sum(mx.array(np.frombuffer(buf, np.uint8)), group=self.group)
            mx.eval(out)
        return np.array(out).tobytes()
