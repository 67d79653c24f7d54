"""The engine process's messages to the server, framed so the server's event loop reads them itself.

The child writes each message as an 8-byte length and its pickle on its end of the duplex pipe
(a socket pair). The server does not park a thread in a blocking read: its event loop watches
the socket and, when it is readable, takes every message that has arrived with non-blocking
receives. A step's events then cost the server one wake-up of the loop and one receive, where a
reader thread cost a receive, a write and a read of the loop's self-pipe (to wake it) and two
hand-overs of the GIL. The other direction (requests, aborts, stats queries: a few a request)
stays multiprocessing's `Connection.send` / `recv`.

NOTE, watching or polling. A frame sent to a reader that sleeps on the socket makes the sender
wake it. Timed in the child's decoding thread on the H200's VMs (one 1B stream,
h200-session17-contexts-1b-frames.txt, run 3), a step's send took 47.5 us (median), the same
pickle written to /dev/null 35 us: the socket and the wake-up ~12 us a token, of ~2-3 ms. A frame
sent to a socket nobody waits on wakes no one. So while frames come fast (a stream's next one
within POLL_GAP_S of the last) the server's loop (engine.host.process) does not watch the socket: it
reads it every POLL_S, and watches it again once POLL_GAP_S pass without a frame or no stream is
left. A stream's first frames still wake the loop (its first token is not held back); the ones
after them wait at most a tick (~1 ms). Frames further apart (a batch of many rows, each step tens
of ms, where one wake-up is shared by the rows) keep waking it: ticking between them would spend
the server's CPU for nothing, and on this 2-core CPU a 1 ms tick under a 16-row batch slowed the
engine's steps (cpu-2core-session17-item7-ab.txt). (The pickle's share: engine.host.process_messages.Events.)
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading
from typing import Any

HEADER = struct.Struct("!Q")
RECV_BYTES = 1 << 18
ONE_WRITE_BYTES = 1 << 16  # a smaller message goes out with its header in one write
POLL_S = 0.001  # while frames come fast, the server reads the socket on this tick (note above)
POLL_GAP_S = 0.01  # "fast": the next frame within this long; the tick ends after this long without one


class FrameWriter:
    """The child's side: `send` may be called from any thread (one message at a time)."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=os.dup(fd))
        self._lock = threading.Lock()

    def send(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        header = HEADER.pack(len(data))
        with self._lock:
            if len(data) < ONE_WRITE_BYTES:
                self._sock.sendall(header + data)
            else:
                self._sock.sendall(header)
                self._sock.sendall(data)


class FrameReader:
    """The server's side: `read` never blocks; `closed` turns true once the child's end is gone."""

    def __init__(self, fd: int) -> None:
        self._sock = socket.socket(fileno=os.dup(fd))
        self._buf = bytearray()
        self.closed = False

    def fileno(self) -> int:
        return self._sock.fileno()

    def read(self) -> list[Any]:
        """Every whole message that has arrived (a part of one waits for the rest)."""
        while not self.closed:
            try:
                chunk = self._sock.recv(RECV_BYTES, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # reset: the child is gone
                self.closed = True
                break
            if not chunk:
                self.closed = True
                break
            self._buf += chunk
            if len(chunk) < RECV_BYTES:
                break  # drained for now; the loop calls again when more arrives
        messages: list[Any] = []
        start, end = 0, len(self._buf)
        view = memoryview(self._buf)
        try:
            while end - start >= HEADER.size:
                (size,) = HEADER.unpack_from(view, start)
                if end - start - HEADER.size < size:
                    break
                body = start + HEADER.size
                messages.append(pickle.loads(view[body : body + size]))
                start = body + size
        finally:
            view.release()
        del self._buf[:start]
        return messages

    def close(self) -> None:
        self._sock.close()
