"""The owner thread: what every host that keeps its model on a thread of this process shares.

`ThreadHost` starts the host's `_main` on one daemon thread and stops it by putting the None
that ends the thread's inbox; the generation host (engine.host.thread) and the embedding host
(engine.host.encoder) each keep only their own `_main` and what they put in the inbox.
`to_loop` hands a result from any such thread back to the event loop, unless it has closed.
"""

from __future__ import annotations

import abc
import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

from mlx_serve.engine.host.client import EngineClient, EngineState

Work = TypeVar("Work")
STOP_TIMEOUT_S = 5.0


class ThreadHost(EngineClient, Generic[Work]):
    """An engine whose model is loaded and served on one owner thread, fed through `_inbox`."""

    thread_name: ClassVar[str]

    def __init__(self, capacity: int, waiting: int | None = None) -> None:
        super().__init__(capacity, waiting)
        self._inbox: queue.SimpleQueue[Work | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._inbox.put(None)  # the owner serves the inbox until this
        if self._thread is not None:
            self._thread.join(timeout=STOP_TIMEOUT_S)
        self.state = EngineState.STOPPED

    @abc.abstractmethod
    def _main(self) -> None:
        """On the owner thread: load the model (READY or FAILED), then serve the inbox."""


def to_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> bool:
    """From another thread: run `callback(*args)` on `loop`; False once the loop has closed
    (the server has stopped: nobody is left to read it)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        return False
    return True
