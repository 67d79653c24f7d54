"""The engine as the server sees it: load, submit, stream events, cancel.

All MLX work happens on one owner thread (engine.core.Core); the event loop only moves
events. Events cross back with `call_soon_threadsafe` into a per-request asyncio queue.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

from engine.admission import MemoryPlan, admit
from engine.core import Core, Ticket
from engine.errors import EngineUnavailable, QueueFull, ServeError
from engine.types import Counters, Event, Finished, Request

log = logging.getLogger("mlx_serve.engine")
CANCELLED = object()


class EngineState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class Gate:
    """Loop-side admission, decided before any response starts: the memory fit of each request
    (max_tokens clamped to the context, or ContextTooLong) and the bound on calls in flight
    (running plus waiting: QueueFull, answered 429 with Retry-After)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.inflight = 0
        self.plan: MemoryPlan | None = None

    def admit(self, requests: Sequence[Request]) -> tuple[list[Request], list[str]]:
        out, warnings = list(requests), []
        if self.plan is not None:
            decisions = [admit(self.plan, len(r.prompt_tokens), r.max_tokens) for r in out]
            out = [replace(r, max_tokens=d.max_tokens) for r, d in zip(out, decisions)]
            warnings = sorted({d.warning for d in decisions if d.warning})
        if self.inflight + len(out) > self.capacity:
            raise QueueFull(
                f"the server is at capacity ({self.capacity} requests running or waiting); retry shortly",
                retry_after_s=1,
            )
        self.inflight += len(out)
        return out, warnings

    def release(self, n: int) -> None:
        self.inflight -= n


class RequestStream:
    """The consumer's end of one API call: its n choices' events, tagged with the choice index.

    `await next()` gives `(index, event)` until every choice has finished, then None; it
    raises the engine's error for the call. `cancel()` stops every choice at the next step.
    """

    def __init__(
        self,
        requests: Sequence[Request],
        loop: asyncio.AbstractEventLoop,
        on_cancel: Callable[[str], None] | None = None,
        on_close: Callable[[], None] | None = None,
        warnings: Sequence[str] = (),
    ) -> None:
        self._events: asyncio.Queue[tuple[int, Event | ServeError] | object] = asyncio.Queue()
        put = self._events.put_nowait
        self.tickets = [Ticket(r, self._emitter(loop, put, i)) for i, r in enumerate(requests)]
        self.index_of = {r.id: i for i, r in enumerate(requests)}
        self._open = set(range(len(requests)))
        self._on_cancel = on_cancel
        self._on_close = on_close
        self.warnings = list(warnings)
        self.done = False

    @staticmethod
    def _emitter(
        loop: asyncio.AbstractEventLoop, put: Callable[[Any], None], i: int
    ) -> Callable[[Event | ServeError], None]:
        return lambda ev: loop.call_soon_threadsafe(put, (i, ev))

    @property
    def request(self) -> Request:
        return self.tickets[0].request

    def push(self, request_id: str, ev: Event | ServeError) -> None:
        """Deliver an event from the loop's own thread."""
        i = self.index_of[request_id]
        self._events.put_nowait((i, ev))
        if isinstance(ev, (Finished, ServeError)):
            self.tickets[i].aborted.set()  # nothing more will come: a later cancel sends nothing

    async def next(self) -> tuple[int, Event] | None:
        if self.done:
            return None
        item: Any = await self._events.get()
        if item is CANCELLED:
            self._end()
            return None
        i, ev = item
        if isinstance(ev, ServeError):
            self._end()
            self.cancel_open()
            raise ev
        if isinstance(ev, Finished):
            self._open.discard(i)
            if not self._open:
                self._end()
        return i, ev

    def _end(self) -> None:
        if not self.done:
            self.done = True
            if self._on_close is not None:
                self._on_close()

    def cancel(self) -> None:
        """The client left: stop generation at the next step and wake the consumer."""
        if not self.done:
            self._events.put_nowait(CANCELLED)
            self._end()
        self.cancel_open()

    def cancel_open(self) -> None:
        for i in self._open:
            ticket = self.tickets[i]
            if not ticket.aborted.is_set():
                ticket.aborted.set()
                if self._on_cancel is not None:
                    self._on_cancel(ticket.request.id)
        self._open.clear()


class Engine:
    """Owns the model and the MLX thread. Loading happens on that thread after `start()`."""

    def __init__(
        self, loader: Callable[[], Any], make_core: Callable[[Any, Counters], Core], capacity: int = 1 << 30
    ) -> None:
        self._loader = loader
        self._make_core = make_core
        self.gate = Gate(capacity)
        self._inbox: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.state = EngineState.LOADING
        self.error: str | None = None
        self.counters = Counters()
        self.loaded: Any = None

    def start(self) -> None:
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

    async def stats(self) -> dict[str, Any]:
        return {"restarts": 0, **asdict(self.counters)}

    def submit(self, requests: Sequence[Request]) -> RequestStream:
        """Queue a call's requests; refusals (not ready, …) raise here, before any response."""
        if not self.ready:
            raise EngineUnavailable(f"model is {self.state.value}; try again shortly")
        admitted, warnings = self.gate.admit(requests)
        stream = RequestStream(
            admitted,
            asyncio.get_running_loop(),
            warnings=warnings,
            on_close=lambda: self.gate.release(len(admitted)),
        )
        for ticket in stream.tickets:
            self._inbox.put(ticket)
        return stream

    def _main(self) -> None:
        try:
            self.loaded = self._loader()
            core = self._make_core(self.loaded, self.counters)
            self.gate.plan = getattr(core, "memory_plan", None)
        except Exception as exc:
            log.exception("model failed to load")
            self.error, self.state = f"{type(exc).__name__}: {exc}", EngineState.FAILED
            return
        self.state = EngineState.READY
        try:
            core.serve(self._inbox)
        except BaseException as exc:  # the loop itself broke: say so on /health
            log.exception("engine loop died")
            self.error, self.state = f"{type(exc).__name__}: {exc}", EngineState.FAILED
