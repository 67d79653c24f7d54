"""The engine on a thread of the server's process (`--engine thread`).

All MLX work happens on one owner thread (engine.batch.core.Core); the event loop only moves
events. A step's events for every request wait in one outbox and cross back together, after the
step, with a single `call_soon_threadsafe` (one wake-up of the loop a step, not one an event),
into each request's asyncio queue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path
from typing import Any

from mlx_serve.engine.batch.core import Core
from mlx_serve.engine.batch.core_parts import Ticket
from mlx_serve.engine.errors import ServeError
from mlx_serve.engine.host.client import EngineState, RequestStream
from mlx_serve.engine.host.owner_thread import ThreadHost, to_loop
from mlx_serve.engine.host.process_child import live_counts
from mlx_serve.engine.model.facts import ModelFacts, model_facts
from mlx_serve.engine.model.loader import LoadedModel
from mlx_serve.engine.model.tokenizer import spelling_span, warm_prompt_path
from mlx_serve.engine.types import Counters, Event

log = logging.getLogger("mlx_serve.engine")

Emit = Callable[[Event | ServeError], None]  # one request's RequestStream.push
Held = list[tuple[Emit, Event | ServeError]]  # a step's events, held until its flush


class ThreadEngine(ThreadHost[Ticket]):
    """Owns the model and the MLX thread. Loading happens on that thread after `start()`."""

    thread_name = "mlx-engine"

    def __init__(
        self,
        loader: Callable[[], LoadedModel],
        make_core: Callable[[LoadedModel, Counters], Core],
        capacity: int = 1 << 30,
        waiting: int | None = None,
    ) -> None:
        super().__init__(capacity, waiting)
        self._loader = loader
        self._make_core = make_core
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: Held = []
        self.counters = Counters()
        # The tickets in flight (on the loop; a finished or cancelled one has its abort flag set):
        # running and waiting as of now, where the step loop's gauges wait for a step's end.
        self._tickets: dict[str, Ticket] = {}

    async def stats(self) -> dict[str, Any]:
        return {"restarts": 0, **asdict(self.counters), **live_counts(self._in_flight())}

    def _in_flight(self) -> dict[str, Ticket]:
        self._tickets = {k: t for k, t in self._tickets.items() if not t.aborted.is_set()}
        return self._tickets

    def _deliver(self, stream: RequestStream) -> None:
        self._loop = asyncio.get_running_loop()
        tickets = self._in_flight()
        for ticket in stream.tickets:  # the same request and abort flag; events go to the outbox
            held = Ticket(ticket.request, partial(_hold, self._outbox, ticket.emit), ticket.aborted)
            tickets[ticket.request.id] = held
            self._inbox.put(held)

    def _flush(self) -> None:
        """On the owner thread, after each step: hand the step's events to the loop at once."""
        if self._outbox and self._loop is not None:
            items = self._outbox[:]
            del self._outbox[:]
            to_loop(self._loop, _push_all, items)

    def _main(self) -> None:
        try:
            loaded = self._loader()
            core = self._make_core(loaded, self.counters)
            plan, span = getattr(core, "memory_plan", None), spelling_span(loaded.tokenizer)
            warm_prompt_path(loaded.tokenizer)
            self._loaded(loaded.model_id, loaded.tokenizer, plan, span, _facts(loaded.path))
        except Exception as exc:  # noqa: BLE001 - any load failure is the model's: FAILED, said once
            self._failed_to_load(exc)
            return
        self.state = EngineState.READY
        try:
            core.serve(self._inbox, self._flush)
        except BaseException as exc:  # the loop itself broke: say so on /health
            log.exception("engine loop died")
            self.error, self.state = f"{type(exc).__name__}: {exc}", EngineState.FAILED
        finally:
            self._flush()  # what the last step emitted


def _facts(path: Path) -> ModelFacts | None:
    """What the model's files say (size, parameters, quantization: Ollama's listings), and
    whether its memory is a GPU's, as the process host reports them (engine.host.build)."""
    facts = model_facts(path)
    if facts is None:
        return None
    import mlx.core as mx

    return replace(facts, on_gpu=mx.default_device().type == mx.DeviceType.gpu)


def _hold(
    outbox: Held,
    emit: Emit,
    ev: Event | ServeError,
) -> None:
    """On the owner thread: keep an event until the step's flush (the owner thread alone appends)."""
    outbox.append((emit, ev))


def _push_all(items: Held) -> None:
    for emit, ev in items:  # on the loop: each request's own emit (RequestStream.push)
        emit(ev)
