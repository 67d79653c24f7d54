"""Messages to the engine process, written by a thread of their own.

A pipe write blocks once the pipe is full; a child that stopped reading (stopped by a signal,
stuck in a step) would then block whoever writes. The event loop only puts messages in a bounded
queue: past OUTBOX_LIMIT waiting messages, `put` says no (the server answers 503) and the loop
goes on serving /health and the streams that still move.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

log = logging.getLogger("mlx_serve.engine")
OUTBOX_LIMIT = 256
_CLOSE = object()


class Outbox:
    """A bounded queue in front of `conn.send`, drained by one daemon thread."""

    def __init__(self, conn: Any, limit: int = OUTBOX_LIMIT) -> None:
        self._conn = conn
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=limit)
        threading.Thread(target=self._drain, name="engine-outbox", daemon=True).start()

    def room(self) -> int:
        return self._queue.maxsize - self._queue.qsize()

    def put(self, message: Any) -> bool:
        """Queue `message` for the child; False (and nothing queued) when the queue is full."""
        try:
            self._queue.put_nowait(message)
        except queue.Full:
            return False
        return True

    def close(self) -> None:
        try:
            self._queue.put_nowait(_CLOSE)
        except queue.Full:
            pass  # the thread is blocked on a child that will be killed: its send then fails

    def _drain(self) -> None:
        while (message := self._queue.get()) is not _CLOSE:
            try:
                self._conn.send(message)
            except (OSError, ValueError):
                return  # the child is gone; the loop reads the end of the pipe and fails its requests
