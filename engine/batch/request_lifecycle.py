"""A request's life in the engine core around its tokens: accepted (its ticket, grammar and
clock), started (its runner row and text pipeline), aborted, failed or dropped.

Apart from engine.batch.core, which keeps the loop, the steps and token delivery: the per-token path.
Core is a RequestLifecycle, so it calls these as its own methods, with no indirection.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from mlx_serve.engine.batch.core_parts import Clock, PrefixLookup, Runner, Ticket
from mlx_serve.engine.batch.row_text import RowText
from mlx_serve.engine.batch.scheduler import Scheduler
from mlx_serve.engine.errors import EngineFailed, ServeError
from mlx_serve.engine.text.reasoning import reasoning_splitter
from mlx_serve.engine.text.stops import StopMatcher
from mlx_serve.engine.tools.formats import HERMES, tool_format_for
from mlx_serve.engine.tools.splitter import ToolCallSplitter
from mlx_serve.engine.types import Admitted, CacheMiss, Counters, Request

if TYPE_CHECKING:  # no MLX here either: the runner holds it
    from mlx_serve.engine.batch.prefix_cache import Found
    from mlx_serve.engine.model.mlx_boundary import LogitsProcessor, Tokenizer
    from mlx_serve.engine.rows.grammar import Constraint, GrammarTokenizer

log = logging.getLogger("mlx_serve.engine")


class RequestLifecycle:
    """The core's records of each request (tickets, text pipelines, clocks, cached prefixes,
    grammars) and the steps that add and remove them; engine.batch.core.Core drives them."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: Runner,
        tokenizer: Tokenizer,
        counters: Counters,
        prefix_cache: PrefixLookup | None = None,
        tool_parser: str | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.tokenizer = tokenizer
        self.counters = counters
        self.prefix_cache = prefix_cache
        self.tickets: dict[str, Ticket] = {}
        self.texts: dict[str, RowText] = {}
        self.clocks: dict[str, Clock] = {}
        self.tool_format = tool_format_for(tokenizer, tool_parser)
        self._prefixes: dict[str, Found] = {}  # admitted rows' cached prefixes, until they start
        self._cache_notes: dict[str, tuple[int, CacheMiss | None]] = {}  # tokens from disk, miss kind
        self._constraints: dict[str, Constraint] = {}  # grammar state of constrained requests, by id
        self._grammar_tokenizer: GrammarTokenizer | None = None  # built on the first constrained request
        self._grammar_lock = threading.Lock()  # prepare_grammar may run on another thread
        scheduler.cached_prefix = self._lookup_prefix

    def _lookup_prefix(self, request: Request) -> int:
        if self.prefix_cache is None:
            return 0
        self.prefix_cache.lookup(request.prompt_tokens)
        found = self.prefix_cache.last
        self._prefixes[request.id] = found
        return found.num_tokens

    def _accept_guarded(self, ticket: Ticket) -> None:
        try:
            self._accept(ticket)
        except Exception as exc:  # a bug for this request alone: it fails, the loop serves on
            log.exception("accepting request %s failed", ticket.request.id)
            self.tickets.pop(ticket.request.id, None)
            self.scheduler.abort(ticket.request.id)
            ticket.emit(EngineFailed(f"generation failed: {type(exc).__name__}: {exc}"))
            self.counters.requests_failed += 1

    def _accept(self, ticket: Ticket) -> None:
        if ticket.aborted.is_set():
            self.counters.requests_aborted += 1
            return
        try:
            constraint = ticket.constraint or self._constraint(ticket.request)
            self.scheduler.add(ticket.request)
        except ServeError as exc:
            ticket.emit(exc)
            return
        self.tickets[ticket.request.id] = ticket
        self.clocks[ticket.request.id] = Clock(time.perf_counter())
        if constraint is not None:
            self._constraints[ticket.request.id] = constraint

    def _constraint(self, request: Request) -> Constraint | None:
        """The request's grammar as a fresh matcher (InvalidRequest if it does not compile)."""
        if request.grammar is None:
            return None
        with self._grammar_lock:
            if self._grammar_tokenizer is None:
                from mlx_serve.engine.rows.grammar import GrammarTokenizer  # llguidance loads only when used

                self._grammar_tokenizer = GrammarTokenizer(self.tokenizer)
        return self._grammar_tokenizer.constraint(request.grammar)

    def prepare_grammar(self, request: Request) -> Constraint | None:
        """The request's grammar compiled now, on the caller's thread (the engine process's
        reader), so the step loop does not stall every stream while a large one compiles.
        None when it has none or fails: the step loop then compiles it and reports the error."""
        try:
            return self._constraint(request)
        except Exception:  # noqa: BLE001 - the step loop's own compile reports it to the client
            return None

    def _reap_aborted(self) -> None:
        for seq_id in [s for s, t in self.tickets.items() if t.aborted.is_set()]:
            try:
                self.scheduler.abort(seq_id)
            except Exception:  # never let one row's bookkeeping take the loop down
                log.exception("dropping aborted request %s failed", seq_id)
            self._drop(seq_id)
            self.counters.requests_aborted += 1

    def _start_guarded(self, seq_id: str, now: float) -> None:
        try:
            self._start(seq_id, now)
        except Exception as exc:
            log.exception("starting request %s failed (only it is ended)", seq_id)
            self.texts.pop(seq_id, None)
            self._fail_row(seq_id, f"{type(exc).__name__}: {exc}")

    def _fail_row(self, seq_id: str, why: str) -> None:
        """End one request with an error; the batch and every other row carry on."""
        self.scheduler.abort(seq_id)  # its runner row is released next step (if it is not gone)
        ticket = self.tickets.get(seq_id)
        if ticket is not None:
            ticket.emit(EngineFailed(f"generation failed: {why}"))
            self.counters.requests_failed += 1
        self._drop(seq_id)

    def _start(self, seq_id: str, now: float) -> None:
        if (clock := self.clocks.get(seq_id)) is not None:
            clock.admitted = now
        ticket = self.tickets.get(seq_id)
        if ticket is not None:
            ticket.started = True
        seq = self.scheduler.get(seq_id)
        assert seq is not None
        found = self._prefixes.pop(seq_id, None)
        request = seq.request
        cache = found.cache if found is not None else None
        constraint: LogitsProcessor | None = self._constraints.pop(seq_id, None)
        if constraint is None and request.thinking_budget is not None:
            request, constraint = self._budgeted(request)
        self.runner.admit(request, cache, seq.num_cached, constraint)
        if found is not None:
            self._cache_notes[seq_id] = (found.from_disk, found.miss)
            self.counters.prompt_tokens_from_disk += found.from_disk
        if ticket is not None:  # the server's account of a request its client may leave early
            ticket.emit(Admitted(seq.num_cached, found.miss if found is not None else None))
        fmt = HERMES if request.forced_tool_calls else self.tool_format
        splitter = ToolCallSplitter(fmt, request.tools) if request.tools else None
        # A grammar shapes the answer from its first token: there is no reasoning to split off.
        split = request.split_reasoning and not request.grammar
        reasoning = reasoning_splitter(self.tokenizer, request.prompt_tokens) if split else None
        self.texts[seq_id] = RowText(
            self.tokenizer.detokenizer, StopMatcher(request.stop), splitter, reasoning
        )
        self.counters.requests_started += 1
        self.counters.prompt_tokens += seq.prompt_len
        self.counters.prefill_tokens += seq.prompt_len - seq.num_cached

    def _budgeted(self, request: Request) -> tuple[Request, LogitsProcessor | None]:
        """The row's thinking budget as a processor (None for a model without thinking
        markers). The row does not speculate: the budget counts the tokens it accepts."""
        from mlx_serve.engine.rows.thinking_budget import ThinkingBudget  # MLX: only rows with a budget

        tok = self.tokenizer
        start, end = getattr(tok, "think_start_tokens", None), getattr(tok, "think_end_tokens", None)
        if not start or not end or request.thinking_budget is None:
            return request, None
        inside = reasoning_splitter(tok, request.prompt_tokens)
        budget = ThinkingBudget(
            request.thinking_budget,
            (*request.thinking_budget_message, *end),
            tuple(start),
            tuple(end),
            inside=inside is not None and inside.inside,
        )
        return replace(request, num_draft_tokens=0), budget

    def _drop(self, seq_id: str) -> None:
        self._cache_notes.pop(seq_id, None)
        self.clocks.pop(seq_id, None)
        self.tickets.pop(seq_id, None)
        self.texts.pop(seq_id, None)
        self._constraints.pop(seq_id, None)

    def _fail_all(self, exc: ServeError) -> None:
        """A fault no row can be blamed for: fail every request the runner held (whether or
        not its row had started), rebuild the runner; those still waiting keep their place."""
        sched = self.scheduler
        held = [s.id for s in (*sched.prefilling, *sched.decoding)]
        for seq_id in dict.fromkeys([*held, *self.texts]):
            sched.abort(seq_id)
            if (ticket := self.tickets.get(seq_id)) is not None:
                ticket.emit(exc)
                self.counters.requests_failed += 1
            self._drop(seq_id)
        sched.take_releases()  # the runner is rebuilt below, rows and all
        self.runner.reset()
