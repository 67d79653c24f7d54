"""The messages between the server and its engine process, pickled over their pipe.

To the child: Submit, Abort and StatsQuery. From it: Ready, Events (every event of a step in
one message), Stats and LoadFailed. A module of their own because both ends import them:
engine.process (the server's side) and engine.process_child (the child's).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import ServeError
from engine.types import Event, Request


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
    items: list[tuple[str, Event | ServeError]]


@dataclass(frozen=True, slots=True)
class Stats:
    nonce: int
    counters: dict[str, Any]


@dataclass(frozen=True, slots=True)
class LoadFailed:
    error: str
