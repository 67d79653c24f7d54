"""Noticing a lost rank: one TCP connection from each follower to rank 0, watched for its end.

MLX's collectives cannot be relied on for that: with mlx 0.32 a ring collective graph whose
peer dies hangs the survivor (a lone all_sum raises, three chained ones never return; upstream
ml-explore/mlx#3862, and JACCL never notices at all, #4278). The connections carry no data: the
kernel ends them when a process dies, and TCP keepalive when a machine vanishes, so a rank stuck
in a collective still learns within seconds that its group is gone.
"""

from __future__ import annotations

import select
import socket
import sys
import threading
from collections.abc import Callable

ACCEPT_TIMEOUT_S = 120.0
# Keepalive probes after 5 s of silence, every 2 s, 3 missed: a vanished machine is noticed in ~11 s.
KEEPALIVE = (5, 2, 3)


def listen(address: str) -> socket.socket:
    """Rank 0's listening socket on the address the other ranks reach it at (any free port)."""
    sock = socket.create_server((address, 0))
    sock.settimeout(ACCEPT_TIMEOUT_S)
    return sock


def accept_followers(server: socket.socket, count: int) -> dict[int, socket.socket]:
    """Each follower's connection, by the rank it announces (one byte per connection)."""
    peers: dict[int, socket.socket] = {}
    with server:
        while len(peers) < count:
            conn, _ = server.accept()
            conn.settimeout(ACCEPT_TIMEOUT_S)
            rank = conn.recv(1)
            if rank:
                peers[rank[0]] = _keepalive(conn)
    return peers


def connect_leader(address: str, port: int, rank: int) -> socket.socket:
    conn = socket.create_connection((address, port), timeout=ACCEPT_TIMEOUT_S)
    conn.sendall(bytes([rank]))
    return _keepalive(conn)


def _keepalive(conn: socket.socket) -> socket.socket:
    conn.settimeout(None)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle, interval, count = KEEPALIVE
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPALIVE", idle), ("TCP_KEEPINTVL", interval)):
        if hasattr(socket, name):  # TCP_KEEPALIVE is macOS's name for the idle time
            conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_KEEPCNT"):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, count)
    return conn


def watch(peers: dict[int, socket.socket], on_lost: Callable[[str], None]) -> threading.Thread:
    """A daemon thread that calls on_lost(reason) once any peer's connection ends."""

    def run() -> None:
        names = {conn.fileno(): rank for rank, conn in peers.items()}
        while True:
            ready, _, _ = select.select(list(peers.values()), [], [])
            for conn in ready:
                try:
                    data = conn.recv(1)
                except OSError as exc:
                    data, why = b"", f": {exc}"
                else:
                    why = ""
                if not data:
                    on_lost(f"rank {names[conn.fileno()]}'s connection closed{why}")
                    return

    thread = threading.Thread(target=run, name="shard-watch", daemon=True)
    thread.start()
    return thread


def print_and_exit(code: int) -> Callable[[str], None]:
    """on_lost for a process that cannot go on without its group."""
    import os

    def lost(reason: str) -> None:
        print(f"mlx-serve: the sharded group lost a rank: {reason}", file=sys.stderr, flush=True)
        os._exit(code)

    return lost
