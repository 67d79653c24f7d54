"""The messages between the server and its engine process, pickled over their pipe.

To the child: Submit, Abort and StatsQuery. From it: Ready, Events (every event of a step in
one message), Stats and LoadFailed. A module of their own because both ends import them:
engine.host.process (the server's side) and engine.host.process_child (the child's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx_serve.engine.errors import ServeError
from mlx_serve.engine.types import Emitted, Request, TextDelta


@dataclass(frozen=True, slots=True)
class Submit:
    request: Request


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str


@dataclass(frozen=True, slots=True)
class StatsQuery:
    nonce: int


@dataclass(frozen=True, slots=True)
class Ready:
    pid: int
    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Events:
    items: list[tuple[str, Emitted | ServeError]]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with each text event as its plain fields: the child sends one of these a step
        from the decoding thread, and a frozen dataclass pickles several times slower than its
        fields (this CPU: 4.5 against 2.0 us for one row, 97 against 9 us for 64; on the H200 a
        step's pickle and send cost that thread ~35-48 us within the decode loop:
        h200-session17-contexts-1b-frames.txt, run 3). Other events, rarer, pickle as they are."""
        wire = [
            (rid, ev.text, ev.token_ids, ev.logprobs) if type(ev) is TextDelta else (rid, ev, None, None)
            for rid, ev in self.items
        ]
        return (_events, (wire,))


def _events(wire: list[tuple[str, Any, Any, Any]]) -> Events:
    """Events from Events.__reduce__'s fields (a text event's token ids are never None)."""
    return Events(
        [(rid, TextDelta(text, ids, lps) if ids is not None else text) for rid, text, ids, lps in wire]
    )


@dataclass(frozen=True, slots=True)
class Stats:
    nonce: int
    counters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LoadFailed:
    error: str
