"""The engine's owner-thread loop: tickets in, scheduler/runner steps, events out."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.errors import EngineFailed, ServeError
from engine.scheduler import Scheduler, StepOutput, StepPlan, TokenUpdate
from engine.stops import StopMatcher
from engine.types import Counters, Event, Finished, FinishReason, Request, TextDelta, Usage

log = logging.getLogger("mlx_serve.engine")


class PrefixLookup(Protocol):
    def lookup(self, tokens: tuple[int, ...]) -> tuple[list[Any] | None, int]: ...


class Runner(Protocol):
    def admit(self, request: Request, cache: list[Any] | None = None, num_cached: int = 0) -> None: ...
    def step(self, plan: StepPlan) -> StepOutput: ...
    def reset(self) -> None: ...


@dataclass(slots=True)
class Ticket:
    """A submitted request and the way back to its consumer."""

    request: Request
    emit: Callable[[Event | ServeError], None]
    aborted: threading.Event = field(default_factory=threading.Event)


@dataclass(slots=True)
class RowText:
    """Token ids to client text for one sequence: UTF-8-safe detokenizing, then stop strings."""

    detokenizer: Any
    stops: StopMatcher

    def add(self, token: int) -> str:
        self.detokenizer.add_token(token)
        return self.stops.feed(self.detokenizer.last_segment)

    def close(self) -> str:
        self.detokenizer.finalize()
        return self.stops.feed(self.detokenizer.last_segment) + self.stops.flush()


class Core:
    """Runs on the MLX owner thread until the inbox yields None."""

    def __init__(self, scheduler: Scheduler, runner: Runner, tokenizer: Any, counters: Counters,
                 prefix_cache: PrefixLookup | None = None) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.tokenizer = tokenizer
        self.counters = counters
        self.prefix_cache = prefix_cache
        self.tickets: dict[str, Ticket] = {}
        self.texts: dict[str, RowText] = {}
        self._prefixes: dict[str, tuple[list[Any] | None, int]] = {}
        self.memory_plan: Any = None  # the admission plan this core was sized by, if any
        scheduler.cached_prefix = self._lookup_prefix

    def _lookup_prefix(self, request: Request) -> int:
        if self.prefix_cache is None:
            return 0
        found = self.prefix_cache.lookup(request.prompt_tokens)
        self._prefixes[request.id] = found
        return found[1]

    def serve(self, inbox: queue.SimpleQueue[Ticket | None],
              flush: Callable[[], None] = lambda: None) -> None:
        """Loop until None arrives; `flush` runs after every step (to batch event delivery)."""
        while True:
            flush()
            block = not self.scheduler.has_work
            while True:
                try:
                    item = inbox.get(block=block)
                except queue.Empty:
                    break
                if item is None:
                    return
                self._accept(item)
                block = False
            self._reap_aborted()
            if self.scheduler.has_work:
                self._step_guarded()

    def _accept(self, ticket: Ticket) -> None:
        if ticket.aborted.is_set():
            self.counters.requests_aborted += 1
            return
        try:
            self.scheduler.add(ticket.request)
        except ServeError as exc:
            ticket.emit(exc)
            return
        self.tickets[ticket.request.id] = ticket

    def _reap_aborted(self) -> None:
        for seq_id in [s for s, t in self.tickets.items() if t.aborted.is_set()]:
            self.scheduler.abort(seq_id)
            self._drop(seq_id)
            self.counters.requests_aborted += 1

    def _step_guarded(self) -> None:
        try:
            self._step()
        except Exception as exc:  # noqa: BLE001 - a fault fails the batch, not the server
            log.exception("engine step failed")
            self._fail_all(EngineFailed(f"generation failed: {type(exc).__name__}: {exc}"))

    def _step(self) -> None:
        plan = self.scheduler.schedule()
        for seq_id in plan.admitted:
            self._start(seq_id)
        out = self.runner.step(plan)
        for update in self.scheduler.update(plan, out):
            self._deliver(update)

    def _start(self, seq_id: str) -> None:
        seq = self.scheduler.get(seq_id)
        assert seq is not None
        cache, _ = self._prefixes.pop(seq_id, (None, 0))
        self.runner.admit(seq.request, cache, seq.num_cached)
        self.texts[seq_id] = RowText(self.tokenizer.detokenizer, StopMatcher(seq.request.stop))
        self.counters.requests_started += 1
        self.counters.prompt_tokens += seq.prompt_len
        self.counters.prefill_tokens += seq.prompt_len - seq.num_cached

    def _deliver(self, u: TokenUpdate) -> None:
        ticket, text = self.tickets.get(u.seq_id), self.texts.get(u.seq_id)
        if ticket is None or text is None:
            return
        self.counters.generated_tokens += 1
        piece = "" if u.finish is FinishReason.STOP else text.add(u.token)
        if piece:
            ticket.emit(TextDelta(piece, (u.token,)))
        if u.finish is None and text.stops.matched is None:
            return
        if u.finish is None:
            self.scheduler.finish(u.seq_id)
        tail = text.close()
        if tail:
            ticket.emit(TextDelta(tail))
        reason = FinishReason.STOP if text.stops.matched is not None else u.finish
        assert reason is not None
        usage = Usage(len(ticket.request.prompt_tokens), u.num_generated, u.num_cached)
        ticket.emit(Finished(reason, usage, text.stops.matched))
        self.counters.requests_finished += 1
        self._drop(u.seq_id)

    def _drop(self, seq_id: str) -> None:
        self.tickets.pop(seq_id, None)
        self.texts.pop(seq_id, None)

    def _fail_all(self, exc: ServeError) -> None:
        """Fail every request the runner held; those still waiting keep their place."""
        for seq_id in list(self.texts):
            self.scheduler.abort(seq_id)
            self.tickets[seq_id].emit(exc)
            self.counters.requests_failed += 1
            self._drop(seq_id)
        self.scheduler.take_releases()  # the runner is rebuilt below, rows and all
        self.runner.reset()
