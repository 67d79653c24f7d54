"""The child side of the engine process: build the core, then serve the pipe until EOF.

Apart from engine.host.process (the server's side) because none of it runs in the server: the
spawned child's entry point (serve_child) and its thread that reads the server's messages.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import asdict
from typing import Any

from mlx_serve.engine.batch.core_parts import Ticket
from mlx_serve.engine.errors import ServeError
from mlx_serve.engine.host.frames import FrameWriter
from mlx_serve.engine.host.process_messages import Abort, Events, LoadFailed, Ready, Stats, StatsQuery, Submit
from mlx_serve.engine.host.settings import LOG_FORMAT
from mlx_serve.engine.types import Counters, Emitted, Finished


def serve_child(conn: Any, build: Any, build_args: tuple[Any, ...], log_level: int = logging.INFO) -> None:
    """Entry point of the engine process: build the core, then serve the pipe until EOF."""
    logging.basicConfig(level=log_level, format=LOG_FORMAT)
    counters = Counters()
    try:
        core, info = build(counters, *build_args)
    except Exception as exc:
        logging.getLogger("mlx_serve.engine").debug("load failed", exc_info=True)
        FrameWriter(conn.fileno()).send(LoadFailed(f"cannot load the model: {type(exc).__name__}: {exc}"))
        return
    inbox: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
    outbox: list[tuple[str, Emitted | ServeError]] = []
    tickets: dict[str, Ticket] = {}
    send = FrameWriter(conn.fileno()).send

    def flush() -> None:
        if outbox:
            items = outbox[:]
            del outbox[:]
            try:
                send(Events(items))
            except OSError:  # the server is gone: no one to answer; stop as at the end of requests
                inbox.put(None)

    def emitter(rid: str) -> Any:
        def emit(ev: Emitted | ServeError) -> None:
            outbox.append((rid, ev))
            if isinstance(ev, (Finished, ServeError)):
                tickets.pop(rid, None)

        return emit

    threading.Thread(
        target=_child_reader,
        args=(conn, inbox, tickets, emitter, send, counters, getattr(core, "prepare_grammar", None)),
        daemon=True,
    ).start()
    import os

    send(Ready(os.getpid(), info))
    core.serve(inbox, flush)


def _child_reader(
    conn: Any,
    inbox: queue.SimpleQueue[Ticket | None],
    tickets: dict[str, Ticket],
    emitter: Any,
    send: Any,
    counters: Counters,
    prepare_grammar: Any = None,
) -> None:
    """The server's messages, read on this thread; a request's grammar is compiled here, off
    the step loop (which would otherwise stall every stream while a large one compiles)."""
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            inbox.put(None)
            return
        if isinstance(message, Submit):
            rid = message.request.id
            fresh = Ticket(message.request, emitter(rid))
            if prepare_grammar is not None and message.request.grammar is not None:
                fresh.constraint = prepare_grammar(message.request)
            tickets[rid] = fresh
            inbox.put(fresh)
        elif isinstance(message, Abort):
            ticket = tickets.pop(message.request_id, None)
            if ticket is not None:
                ticket.aborted.set()
        elif isinstance(message, StatsQuery):
            send(Stats(message.nonce, {**asdict(counters), **live_counts(tickets), "at": time.time()}))


def live_counts(tickets: dict[str, Ticket]) -> dict[str, int]:
    """Running and waiting requests as of now, from the tickets in flight: the step loop's
    gauges are refreshed only between steps, so during a long prefill step they would miss a
    request that arrived or left since it began. (list() copies the dict in one go: the step
    loop pops finished tickets from another thread.)"""
    live = [t for t in list(tickets.values()) if not t.aborted.is_set()]
    running = sum(1 for t in live if t.started)
    return {"num_requests_running": running, "num_requests_waiting": len(live) - running}
