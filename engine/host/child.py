"""The parent's side of one engine child process: the plan to start it, and its record."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlx_serve.engine.host.client import RequestStream
from mlx_serve.engine.host.frames import FrameReader
from mlx_serve.engine.host.outbox import Outbox


@dataclass(frozen=True, slots=True)
class ChildPlan:
    """How to start the engine process: the child builds its core with `build(counters, *args)`
    while this process loads the tokenizer the protocols need (the two overlap at start-up)."""

    model_id: str
    build: Callable[..., Any]
    build_args: tuple[Any, ...]
    load_tokenizer: Callable[[], Any]


@dataclass(slots=True)
class ChildProcess:
    process: Any
    conn: Any  # requests go out through `outbox`; the child's messages come in through `reader`
    outbox: Outbox
    pid: int = 0
    streams: dict[str, RequestStream] = field(default_factory=dict)
    reader: FrameReader | None = None
    polling: asyncio.TimerHandle | None = None  # the next read on the tick; None: the loop watches the socket
    last_frame: float = -1.0  # loop time of the last read that found a message
