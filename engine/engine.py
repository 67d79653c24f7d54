"""The engine as the server sees it: load, submit, stream events, abort.

All MLX work happens on one owner thread; the event loop only moves events. Events cross
back with `call_soon_threadsafe` into a per-request asyncio queue.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.errors import EngineFailed, EngineUnavailable, ServeError
from engine.types import Aborted, Counters, Event, Finished, Request, TextDelta

log = logging.getLogger("mlx_serve.engine")


class EngineState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


CANCELLED = object()


class Runner(Protocol):
    """Runs one request on the owner thread, checking `is_aborted` at every step."""

    def run(self, req: Request, is_aborted: Callable[[], bool]) -> Iterator[Event]: ...


@dataclass(slots=True)
class _Ticket:
    """A submitted request and the way back to its consumer."""

    request: Request
    emit: Callable[[Event | ServeError], None]
    aborted: threading.Event = field(default_factory=threading.Event)


class RequestStream:
    """The consumer's end of one request: `await next()` until a Finished event."""

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop) -> None:
        self._events: asyncio.Queue[Event | ServeError | object] = asyncio.Queue()
        put = self._events.put_nowait
        self.ticket = _Ticket(request, lambda ev: loop.call_soon_threadsafe(put, ev))
        self.request = request
        self.done = False

    async def next(self) -> Event | None:
        """The next event; None once cancelled. Raises the engine's error for this request."""
        ev = await self._events.get()
        if ev is CANCELLED:
            self.done = True
            return None
        if isinstance(ev, ServeError):
            self.done = True
            raise ev
        assert isinstance(ev, (Finished, TextDelta))
        self.done = isinstance(ev, Finished)
        return ev

    def cancel(self) -> None:
        """The client left: stop generation at the next step and wake the consumer."""
        if not self.done:
            self.ticket.aborted.set()
            self._events.put_nowait(CANCELLED)

    async def __aiter__(self) -> AsyncIterator[Event]:
        try:
            while (ev := await self.next()) is not None:
                yield ev
                if isinstance(ev, Finished):
                    return
        finally:
            self.cancel()


class Engine:
    """Owns the model and the MLX thread. `load` is blocking; call it off the loop."""

    def __init__(self, loader: Callable[[], Any], make_runner: Callable[[Any, Counters], Runner]) -> None:
        self._loader = loader
        self._make_runner = make_runner
        self._inbox: queue.SimpleQueue[_Ticket | None] = queue.SimpleQueue()
        self._tickets: dict[str, _Ticket] = {}
        self._thread: threading.Thread | None = None
        self.state = EngineState.LOADING
        self.error: str | None = None
        self.counters = Counters()
        self.loaded: Any = None

    def start(self) -> None:
        """Load the model on the owner thread and begin serving."""
        self._thread = threading.Thread(target=self._main, name="mlx-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.state = EngineState.STOPPED

    @property
    def ready(self) -> bool:
        return self.state is EngineState.READY

    async def wait_ready(self, poll_s: float = 0.05) -> None:
        while self.state is EngineState.LOADING:
            await asyncio.sleep(poll_s)
        if self.state is not EngineState.READY:
            raise EngineUnavailable(f"engine is {self.state.value}: {self.error}")

    def submit(self, request: Request) -> RequestStream:
        """Queue a request; refusals (not ready, …) raise here, before any response starts."""
        if not self.ready:
            raise EngineUnavailable(f"model is {self.state.value}; try again shortly")
        stream = RequestStream(request, asyncio.get_running_loop())
        self._tickets[request.id] = stream.ticket
        self._inbox.put(stream.ticket)
        return stream

    def abort(self, request_id: str) -> None:
        ticket = self._tickets.get(request_id)
        if ticket is not None:
            ticket.aborted.set()

    def _main(self) -> None:
        try:
            self.loaded = self._loader()
        except Exception as exc:  # noqa: BLE001 - any load failure makes the engine unusable
            log.exception("model failed to load")
            self.error, self.state = f"{type(exc).__name__}: {exc}", EngineState.FAILED
            return
        runner = self._make_runner(self.loaded, self.counters)
        self.state = EngineState.READY
        while (ticket := self._inbox.get()) is not None:
            self._serve(runner, ticket)

    def _serve(self, runner: Runner, ticket: _Ticket) -> None:
        if ticket.aborted.is_set():
            self.counters.requests_aborted += 1
            self._tickets.pop(ticket.request.id, None)
            return
        self.counters.requests_started += 1
        try:
            for ev in runner.run(ticket.request, ticket.aborted.is_set):
                ticket.emit(ev)
            self.counters.requests_finished += 1
        except Aborted:
            self.counters.requests_aborted += 1
        except Exception as exc:  # noqa: BLE001 - a fault fails this request, not the server
            log.exception("generation failed for %s", ticket.request.id)
            self.counters.requests_failed += 1
            ticket.emit(EngineFailed(f"generation failed: {type(exc).__name__}: {exc}"))
        finally:
            self._tickets.pop(ticket.request.id, None)
