"""What one step's events cost the engine process to send to the server (issue 19 item 1, served).

    python -m bench.frame_send [--sends 2000] [--gap-us 2000]

The engine process sends each step's events as one frame (`engine.host.frames.FrameWriter`: a pickle
and a `sendall` on a socket pair) to the server's event loop. This times `send` on the engine's
side with a reader in another process that, like the server, sleeps in `select` until a frame
arrives: back to back (the reader stays awake) and with `--gap-us` of busy work between sends, as
one stream's steps are spaced (the reader has gone back to sleep, so every send must wake it).
Also the pickle alone. Medians and p90 in microseconds.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import pickle
import selectors
import socket
import statistics
import time

from bench.report import percentile
from engine.host.frames import FrameReader, FrameWriter
from engine.host.process_messages import Events
from engine.types import TextDelta


def drain(sock: socket.socket) -> None:
    reader = FrameReader(sock.fileno())
    sel = selectors.DefaultSelector()
    sel.register(reader.fileno(), selectors.EVENT_READ)
    while not reader.closed:
        sel.select()
        reader.read()


def drain_polling(sock: socket.socket, every_s: float = 0.001) -> None:
    """As `drain`, but never waiting on the socket: a non-blocking read every `every_s`, so a
    send finds no reader to wake (what a server that polls its engine's socket would be)."""
    reader = FrameReader(sock.fileno())
    while not reader.closed:
        reader.read()
        time.sleep(every_s)


def _events() -> Events:
    return Events([("chatcmpl-0123456789abcdef", TextDelta(" word", (1234,)))])


def _spin(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sends", type=int, default=2000)
    p.add_argument("--gap-us", type=float, default=2000.0)
    args = p.parse_args()
    ours, theirs = socket.socketpair()
    reader = mp.get_context("spawn").Process(target=drain, args=(theirs,), daemon=True)
    reader.start()
    theirs.close()
    writer = FrameWriter(ours.fileno())
    for _ in range(200):  # the reader process is up and reading
        writer.send(_events())
    time.sleep(0.5)
    for gap in (0.0, args.gap_us):
        took = []
        for _ in range(args.sends):
            ev = _events()
            t = time.perf_counter()
            writer.send(ev)
            took.append(1e6 * (time.perf_counter() - t))
            if gap:
                _spin(gap)
        p90 = percentile(took, 90) or 0.0
        print(f"send, {gap:6.0f} us apart: median {statistics.median(took):6.1f} us  p90 {p90:6.1f} us")
    t = time.perf_counter()
    for _ in range(args.sends):
        pickle.dumps(_events(), protocol=pickle.HIGHEST_PROTOCOL)
    print(f"pickle alone:             {1e6 * (time.perf_counter() - t) / args.sends:6.1f} us")
    reader.terminate()


if __name__ == "__main__":
    main()
