"""The engine as the server sees it: one interface, whichever host runs the model.

`EngineClient` is what server/ may use of the engine: `start`/`stop`, `state`/`ready`/
`wait_ready`, `submit(requests) -> RequestStream` (admission refuses before any byte: a typed
error), `stats()`, and `model` (the facts the protocols need: id, chat tokenizer, context).
Two hosts implement it: `engine.host.thread.ThreadEngine` (the model on a thread of this process)
and `engine.host.process.ProcessEngine` (the model in a restartable child process). `engine.host.build`
makes one from settings; the server never imports anything else of the engine but its types.
"""

from __future__ import annotations

import abc
import asyncio
import enum
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np

from mlx_serve.engine.batch.admission import MemoryPlan, admit
from mlx_serve.engine.batch.core_parts import Ticket
from mlx_serve.engine.errors import EngineUnavailable, InvalidRequest, QueueFull, ServeError
from mlx_serve.engine.host.grammar_check import GrammarChecks
from mlx_serve.engine.model.facts import ModelFacts
from mlx_serve.engine.model.tokenizer import ChatTokenizer
from mlx_serve.engine.types import Admitted, EmbedInput, Emitted, Event, Finished, Request

CANCELLED = object()


class EngineState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"
    STALLED = "not responding"  # work in flight, no step for a while (engine.host.watchdog)


class Gate:
    """Loop-side admission, decided before any response starts: the memory fit of each request
    (max_tokens clamped to the context, or ContextTooLong) and the bound on calls in flight
    (running plus waiting: QueueFull, answered 429 with Retry-After)."""

    def __init__(self, capacity: int, waiting: int | None = None) -> None:
        self.capacity = capacity
        self.waiting = waiting  # the queue's bound; None: `capacity` is fixed
        self.inflight = 0
        self.plan: MemoryPlan | None = None

    def size(self, plan: MemoryPlan | None) -> None:
        """Take the engine's plan: admission by its context, capacity = its rows + the queue."""
        self.plan = plan
        if plan is not None and self.waiting is not None:
            self.capacity = plan.max_running + self.waiting

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
        on_cancel: Callable[[str], None] | None = None,
        on_close: Callable[[], None] | None = None,
        warnings: Sequence[str] = (),
    ) -> None:
        self._events: asyncio.Queue[tuple[int, Event | ServeError] | object] = asyncio.Queue()
        # a ticket's emit delivers on the loop's own thread (an engine host brings events there)
        self.tickets = [Ticket(r, partial(self.push, r.id)) for r in requests]
        self.index_of = {r.id: i for i, r in enumerate(requests)}
        self._open = set(range(len(requests)))
        self._on_cancel = on_cancel
        self._on_close = on_close
        self.warnings = list(warnings)
        self.done = False
        self.admitted: dict[int, Admitted] = {}  # by choice: what the prefix cache served it
        # set by the first choice's note, or anything that comes before it (an event, an error, the end)
        self._admission = asyncio.Event()

    @property
    def request(self) -> Request:
        return self.tickets[0].request

    def push(self, request_id: str, ev: Emitted | ServeError) -> None:
        """Deliver an event from the loop's own thread (an Admitted note is kept, not queued)."""
        i = self.index_of[request_id]
        if isinstance(ev, Admitted):
            self.admitted[i] = ev
            if i == 0:
                self._admission.set()
            return
        self._events.put_nowait((i, ev))
        self._admission.set()
        if isinstance(ev, (Finished, ServeError)):
            self.tickets[i].aborted.set()  # nothing more will come: a later cancel sends nothing

    def pending(self) -> int:
        return 0 if self.done else self._events.qsize()

    async def admission(self) -> Admitted | None:
        """Wait until the first choice's row has begun and give the engine's note of it (what the
        prefix cache served); None when an event, an error or the end came first."""
        await self._admission.wait()
        return self.admitted.get(0)

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
        self._admission.set()
        self.cancel_open()

    def cancel_open(self) -> None:
        for i in self._open:
            ticket = self.tickets[i]
            if not ticket.aborted.is_set():
                ticket.aborted.set()
                if self._on_cancel is not None:
                    self._on_cancel(ticket.request.id)
        self._open.clear()


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What the server and the protocols may know of the loaded model."""

    model_id: str
    tokenizer: ChatTokenizer
    context_length: int | None = None  # the longest context a request may use (memory plan)
    dimensions: int | None = None  # an embedding model's vector size; None: a generation model
    facts: ModelFacts | None = None  # size, parameters, quantization (model listings); None: unknown


@dataclass(frozen=True, slots=True)
class Embeddings:
    """One embeddings call's answer: a float32 vector per input, in order, and the tokens read."""

    vectors: np.ndarray
    prompt_tokens: int


class EngineClient(abc.ABC):
    """The server's one handle on the engine (see the module docstring)."""

    def __init__(self, capacity: int, waiting: int | None = None) -> None:
        self.gate = Gate(capacity, waiting)
        self.state = EngineState.LOADING
        self.error: str | None = None
        self.model: ModelInfo | None = None
        self.on_fatal: Callable[[str], None] | None = None

    @abc.abstractmethod
    def start(self) -> None:
        """Begin loading (off the event loop); /health is 503 until `ready`."""

    @abc.abstractmethod
    def stop(self) -> None: ...

    @abc.abstractmethod
    async def stats(self) -> dict[str, Any]:
        """The engine's counters, read now."""

    @abc.abstractmethod
    def _deliver(self, stream: RequestStream) -> None:
        """Hand an admitted call's tickets to the model's owner."""

    def _abort(self, request_id: str) -> None:
        """Tell the model's owner a request was cancelled (a thread host sees the ticket itself)."""

    def _failed_to_load(self, exc: Exception) -> None:
        """The model could not be loaded: FAILED, said once (by the server when it listens for
        that, which then exits; else in the log)."""
        logging.getLogger("mlx_serve.engine").debug("model failed to load", exc_info=exc)
        self.error, self.state = f"cannot load the model: {type(exc).__name__}: {exc}", EngineState.FAILED
        if self.on_fatal is not None:
            self.on_fatal(self.error)
        else:
            logging.getLogger("mlx_serve.engine").error("%s", self.error)

    def _accepting(self) -> bool:
        return self.ready

    @property
    def ready(self) -> bool:
        return self.state is EngineState.READY

    async def wait_ready(self, poll_s: float = 0.05) -> None:
        while self.state is EngineState.LOADING:
            await asyncio.sleep(poll_s)
        if self.state is not EngineState.READY:
            raise EngineUnavailable(f"engine is {self.state.value}: {self.error}")

    async def embed(self, inputs: Sequence[EmbedInput], dimensions: int | None = None) -> Embeddings:
        """Vectors for `inputs` (texts or token ids) from an embedding model's engine."""
        name = self.model.model_id if self.model else "this model"
        raise InvalidRequest(
            f"model '{name}' generates text; it has no embeddings (serve an embedding model, "
            "e.g. --model all-minilm-l6-v2)",
            param="model",
        )

    def submit(self, requests: Sequence[Request]) -> RequestStream:
        """Admit a call's requests (one per choice) and start them; refusals raise here."""
        if not self._accepting():
            raise EngineUnavailable(f"model is {self.state.value}; try again shortly")
        admitted, warnings = self.gate.admit(requests)
        stream = RequestStream(
            admitted,
            on_cancel=self._abort,
            on_close=lambda: self.gate.release(len(admitted)),
            warnings=warnings,
        )
        try:
            self._deliver(stream)
        except ServeError:
            self.gate.release(len(admitted))  # refused before any of it reached the engine
            raise
        return stream

    _grammars: GrammarChecks | None = None

    async def check_grammars(self, requests: Sequence[Request]) -> None:
        """A 400 for a grammar this model's vocabulary cannot follow, before admission (see
        engine.host.grammar_check); nothing for requests without one."""
        grammars = {r.grammar for r in requests if r.grammar is not None}
        if not grammars or self.model is None:
            return
        if self._grammars is None:
            self._grammars = GrammarChecks(self.model.tokenizer.wrapper)
        await self._grammars.check(grammars)

    def _loaded(
        self,
        model_id: str,
        tokenizer: Any,
        plan: MemoryPlan | None,
        span: int,
        facts: ModelFacts | None = None,
    ) -> None:
        """Record what was loaded: the facts for the protocols and the plan for admission.
        `span` is tokenizer.spelling_span(tokenizer), read where the tokenizer was loaded;
        `facts` what the model's files say (engine.model.facts), its memory added here."""
        self.gate.size(plan)
        context = plan.context_limit if plan is not None else None
        if facts is not None and plan is not None:
            facts = replace(
                facts, memory_bytes=plan.weights_bytes + plan.context_limit * plan.kv_bytes_per_token
            )
        self.model = ModelInfo(model_id, ChatTokenizer(tokenizer, context, span), context, facts=facts)
