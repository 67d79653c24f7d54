"""Hypercorn's per-connection server (asyncio), with what a public listener needs besides.

- A connection whose client closes (or half-closes) while no request is in flight is closed at
  once. Hypercorn's own waits for its keep-alive timer first (75 s here): the socket sits in
  CLOSE-WAIT, and a connect-and-close flood held every slot of --max-connections for as long.
- A connection that has sent no request head within FIRST_REQUEST_S is closed: the keep-alive
  timeout is for the pause between requests, not for a connection that never speaks.

- HTTP/2 (h2 under Hypercorn): a frame header announcing more than SETTINGS_MAX_FRAME_SIZE is
  a FRAME_SIZE_ERROR GOAWAY as soon as its 9 bytes arrive (RFC 9113 4.2); h2 itself buffered the
  whole frame first, up to 16 MiB a connection. Control frames (PING, SETTINGS, RST_STREAM,
  PRIORITY, empty DATA) are held to CONTROL_FRAMES_PER_S per connection with a burst of
  CONTROL_FRAME_BURST; past it, a GOAWAY ENHANCE_YOUR_CALM, not seconds of the event loop.

`install()` makes Hypercorn's asyncio worker use `ServedConnection` and `LimitedH2`;
`connections.serve` calls it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import hypercorn.protocol
from h2.exceptions import DenialOfServiceError, FrameTooLargeError
from h2.frame_buffer import FrameBuffer
from hypercorn.asyncio import run as hypercorn_run
from hypercorn.asyncio.tcp_server import TCPServer
from hypercorn.events import Event, Updated
from hypercorn.protocol.h2 import H2Protocol
from hyperframe.frame import DataFrame, Frame, PingFrame, PriorityFrame, RstStreamFrame, SettingsFrame

FIRST_REQUEST_S = 10.0
CONTROL_FRAMES_PER_S = 100.0
CONTROL_FRAME_BURST = 1000.0


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


class LimitedFrames(FrameBuffer):
    """h2's frame buffer, checking each frame's length as soon as its header is in, and
    holding control frames to a token bucket."""

    def __init__(self, server: bool = False) -> None:
        super().__init__(server)
        self._tokens = CONTROL_FRAME_BURST
        self._at = time.monotonic()

    def __next__(self) -> Frame:
        if len(self._data) >= 9:
            length = int.from_bytes(self._data[:3], "big")
            if length > self.max_frame_size:
                raise FrameTooLargeError(
                    f"frame of {length} bytes; SETTINGS_MAX_FRAME_SIZE is {self.max_frame_size}"
                )
        frame = super().__next__()
        if _is_control(frame):
            self._spend()
        return frame

    def _spend(self) -> None:
        now = time.monotonic()
        self._tokens = min(CONTROL_FRAME_BURST, self._tokens + (now - self._at) * CONTROL_FRAMES_PER_S)
        self._at = now
        if self._tokens < 1:
            raise DenialOfServiceError(f"over {CONTROL_FRAMES_PER_S:g} control frames a second")
        self._tokens -= 1


def _is_control(frame: Frame) -> bool:
    if isinstance(frame, PingFrame | SettingsFrame):
        return "ACK" not in frame.flags
    if isinstance(frame, DataFrame):
        return not frame.data and "END_STREAM" not in frame.flags
    return isinstance(frame, RstStreamFrame | PriorityFrame)


class LimitedH2(H2Protocol):
    """Hypercorn's HTTP/2 protocol over LimitedFrames."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connection.incoming_buffer = LimitedFrames(server=True)


def install() -> None:
    """Hypercorn's asyncio worker serves each connection with ServedConnection and LimitedH2."""
    hypercorn_run.TCPServer = ServedConnection  # type: ignore[attr-defined]
    hypercorn.protocol.H2Protocol = LimitedH2  # type: ignore[attr-defined]
