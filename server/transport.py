"""Hypercorn's per-connection server (asyncio), with what a public listener needs besides.

- A connection whose client closes (or half-closes) while no request is in flight is closed at
  once. Hypercorn's own waits for its keep-alive timer first (75 s here): the socket sits in
  CLOSE-WAIT, and a connect-and-close flood held every slot of --max-connections for as long.
- A connection that has sent no request head within FIRST_REQUEST_S is closed: the keep-alive
  timeout is for the pause between requests, not for a connection that never speaks.

`install()` makes Hypercorn's asyncio worker use `ServedConnection`; `connections.serve` calls it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypercorn.asyncio import run as hypercorn_run
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.events import Event, Updated

FIRST_REQUEST_S = 10.0


class ServedConnection(TCPServer):
    """One client connection, as Hypercorn serves it, with the changes in the module docstring."""

    first_request_s = FIRST_REQUEST_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._spoke = False  # a request head has arrived on this connection
        self._ended = False  # the client has sent its last byte

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, Updated) and not event.idle:
            self._spoke = True
        await super().protocol_send(event)

    async def _read_data(self) -> None:
        await super()._read_data()
        # The client sent its last byte: no new request can come, so the keep-alive timer has
        # nothing to wait for (a request in flight still runs to its end, then the idle timer,
        # started again, closes at once).
        self._ended = True
        await self.idle_task.stop()

    async def _idle_timeout(self) -> None:
        limit = self.config.keep_alive_timeout
        if not self._spoke:
            limit = min(limit, self.first_request_s)
        if self._ended:
            limit = 0
        try:
            await asyncio.wait_for(self.context.terminated.wait(), limit)
        except TimeoutError:
            pass
        await asyncio.shield(self._initiate_server_close())


def install() -> None:
    """Hypercorn's asyncio worker serves each connection with ServedConnection."""
    hypercorn_run.TCPServer = ServedConnection  # type: ignore[attr-defined]
