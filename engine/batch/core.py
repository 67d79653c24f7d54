"""The engine's owner-thread loop: tickets in, scheduler/runner steps, events out.

A request's bookkeeping around its tokens (accept, start, fail, drop): engine.batch.request_lifecycle.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from mlx_serve.engine.batch.core_parts import IdleWork, LoneRunner, PrefixHolding, Ticket
from mlx_serve.engine.batch.request_lifecycle import RequestLifecycle
from mlx_serve.engine.batch.scheduler import SeqState
from mlx_serve.engine.errors import EngineFailed
from mlx_serve.engine.rows.step_records import StepPlan, TokenUpdate
from mlx_serve.engine.types import (
    Finished,
    FinishReason,
    TokenLogprob,
    Usage,
)

if TYPE_CHECKING:  # the core itself imports no MLX: the runner holds it
    from mlx_serve.engine.batch.admission import MemoryPlan

log = logging.getLogger("mlx_serve.engine")


class Core(RequestLifecycle):
    """Runs on the MLX owner thread until the inbox yields None."""

    memory_plan: MemoryPlan | None = None  # the admission plan this core was sized by, if any
    # Work done only while no request is in the engine, one unit per pass of the loop (the GPU
    # warm-up: engine.host.warmup), so a request that arrives waits for one unit at most; and only after
    # `idle_after_s` without a step (or since `serve` began), so a client's first request right
    # after start-up, or its next turn, does not find a unit under way.
    idle_work: IdleWork | None = None
    idle_after_s = 1.0
    # Told the KV slots the running rows hold, each step: the prefix cache keeps to the rest
    # (a row that needs KV memory evicts cache, never waits on it). None: a fixed cap.
    prefix_room: Callable[[int], None] | None = None
    on_stop: Callable[[], None] | None = None  # when serve returns: the prefix cache's last disk writes
    _last_step = 0.0
    _flush_events: Callable[[], None] | None = None

    def serve(
        self, inbox: queue.SimpleQueue[Ticket | None], flush: Callable[[], None] = lambda: None
    ) -> None:
        """Loop until None arrives; `flush` runs after every step (to batch event delivery)."""
        self._last_step = time.monotonic()
        self._flush_events = flush
        while True:
            flush()
            block = not self.scheduler.has_work
            # with idle work pending, wait for a request only until the idle work is due
            timeout = self._idle_due() if block and self.idle_work is not None else None
            while True:
                try:
                    item = inbox.get(block=block, timeout=timeout)
                except queue.Empty:
                    break
                if item is None:
                    if self.on_stop is not None:
                        self.on_stop()
                    return
                if self.idle_work is not None:
                    self.idle_work.pause()  # what a part under way holds is freed for the request
                self._accept_guarded(item)
                block, timeout = False, None
            self._reap_aborted()
            if self.scheduler.has_work:
                self._step_guarded()
                self._alone_guarded(inbox, flush)
                self._last_step = time.monotonic()
                if not self.scheduler.has_work:
                    self._fit_prefix_cache()  # idle now: what the last rows left goes to disk
            elif self.idle_work is not None and self._idle_due() == 0.0:
                self._idle_unit(self.idle_work)
            self._gauge()

    def _idle_due(self) -> float:
        """Seconds until idle work may run."""
        return max(0.0, self._last_step + self.idle_after_s - time.monotonic())

    def _idle_unit(self, work: IdleWork) -> None:
        try:
            if not work.step():
                self.idle_work = None
        except Exception:  # idle work is an optimisation: it stops, the engine serves on
            log.exception("idle work failed; stopped")
            self.idle_work = None

    def _gauge(self) -> None:
        sched, c = self.scheduler, self.counters
        c.num_requests_running, c.num_requests_waiting = sched.num_active, len(sched.waiting)
        cap = sched.config.kv_capacity_tokens
        if cap:
            held = sum(s.num_computed + s.num_generated for s in (*sched.prefilling, *sched.decoding))
            c.kv_cache_usage_perc = round(held / cap, 6)
        if isinstance(store := self.prefix_cache, PrefixHolding):
            c.prefix_cache_bytes, c.prefix_cache_blocks = store.nbytes, len(store)

    def _step_guarded(self) -> None:
        try:
            self._step()
        except Exception as exc:
            log.exception("engine step failed")
            self._fail_all(EngineFailed(f"generation failed: {type(exc).__name__}: {exc}"))

    def _step(self) -> None:
        started = time.perf_counter()
        sched = self.scheduler
        self._fit_prefix_cache()  # rows that left since: their room is the cache's
        if sched.releasing and sched.waiting:
            # Rows that left keep their KV in the prefix cache before a waiting request looks
            # its prefix up: a prompt sent again right after its abort resumes where it stopped.
            self.runner.step(StepPlan((), (), sched.take_releases(), ()))
        plan = sched.schedule()
        self._fit_prefix_cache()  # rows admitted now: their room is theirs
        for seq_id in plan.admitted:
            self._start_guarded(seq_id, started)
        if plan.admitted and self._flush_events is not None:
            self._flush_events()  # their Admitted notes reach the server before a long prefill step
        live = tuple(c for c in plan.prefill if c.seq_id in self.texts)
        if len(live) != len(plan.prefill):
            plan = replace(plan, prefill=live)  # a row that failed to start takes no step
        out = self.runner.step(plan)
        if plan.prefill:
            took = round(time.perf_counter() - started, 6)
            for chunk in plan.prefill:
                if (clock := self.clocks.get(chunk.seq_id)) is not None:
                    clock.chunks.append((chunk.end - chunk.start, took))
        for drafted, accepted in out.speculation.values():
            self.counters.spec_decode_num_drafts += 1
            self.counters.spec_decode_num_draft_tokens += drafted
            self.counters.spec_decode_num_accepted_tokens += accepted
        for seq_id, why in out.failed.items():
            self._fail_row(seq_id, why)
        for update in self.scheduler.update(plan, out):
            self._deliver_guarded(update)
        self._account(plan, started)

    def _fit_prefix_cache(self) -> None:
        if self.prefix_room is not None:
            self.prefix_room(self.scheduler.kv_slots_held())

    def _alone_guarded(self, inbox: queue.SimpleQueue[Ticket | None], flush: Callable[[], None]) -> None:
        try:
            self._step_alone(inbox, flush)
        except Exception as exc:  # as in _step_guarded: a fault no row can be blamed for
            log.exception("engine step failed")
            self._fail_all(EngineFailed(f"generation failed: {type(exc).__name__}: {exc}"))

    def _step_alone(self, inbox: queue.SimpleQueue[Ticket | None], flush: Callable[[], None]) -> None:
        """While one plain row decodes and nothing else is asked of the engine, step it without
        the scheduler's plan and update and the runner's step records: the same forward, sampler,
        finish rules and delivery with less Python a token (one stream on an accelerator is bound
        by this thread: issue 19 item 1). Back to the loop as soon as anything else is to be done:
        a request or an abort arrives, or the row ends (its length, an end token, a stop string)."""
        sched, lone, c = self.scheduler, self.runner, self.counters
        seq = sched.alone()
        # not a runner that must see every step (a sharded leader publishes each to its followers)
        if seq is None or not isinstance(lone, LoneRunner) or not lone.alone(seq.id):
            return
        ticket = self.tickets.get(seq.id)
        self._gauge()  # /stats counts the row running while it steps alone, not after
        cap = sched.config.kv_capacity_tokens
        while ticket is not None and not ticket.aborted.is_set() and inbox.empty():
            started = time.perf_counter()
            token = lone.step_alone()
            if failed := lone.take_failed():
                for seq_id, why in failed.items():
                    self._fail_row(seq_id, why)
                return
            self._deliver_guarded(sched.advance(seq, token))
            c.engine_steps += 1
            c.engine_step_rows += 1
            c.engine_step_seconds += time.perf_counter() - started
            if cap:
                c.kv_cache_usage_perc = round((seq.num_computed + seq.num_generated) / cap, 6)
            flush()
            if seq.state is not SeqState.DECODING:  # it ended, or a stop string ended it
                return

    def _account(self, plan: StepPlan, started: float) -> None:
        if not (plan.decode or plan.prefill):
            return  # only released rows: no forward ran
        c, took = self.counters, time.perf_counter() - started
        self.scheduler.cost.observe(sum(ch.end - ch.start for ch in plan.prefill), len(plan.decode), took)
        c.engine_steps += 1
        c.engine_step_rows += len(plan.decode)
        c.engine_step_seconds += took
        if plan.prefill:
            c.engine_join_steps += 1
            c.engine_join_step_seconds += took

    def _deliver_guarded(self, update: TokenUpdate) -> None:
        try:
            self._deliver(update)
        except Exception as exc:  # detokenizing, stop strings, tool-call parsing: this row's own
            log.exception("delivering a token of request %s failed (only it is ended)", update.seq_id)
            self._fail_row(update.seq_id, f"{type(exc).__name__}: {exc}")

    def _deliver(self, u: TokenUpdate) -> None:
        ticket, text = self.tickets.get(u.seq_id), self.texts.get(u.seq_id)
        if ticket is None or text is None:
            return
        self.counters.generated_tokens += 1
        clock = self.clocks.get(u.seq_id)
        if clock is not None and clock.first_token is None:
            clock.first_token = time.perf_counter()
        if u.finish is not FinishReason.STOP:  # an EOS token has no text
            deltas = text.add(u.token, self._token_logprob(u))
            if deltas and clock is not None and clock.first_delta is None:
                clock.first_delta = time.perf_counter()
            for delta in deltas:
                ticket.emit(delta)
        over = text.stops.matched is not None or text.calls_ended  # the answer ended before the model did
        if u.finish is None and not over:
            return
        if u.finish is None:
            self.scheduler.finish(u.seq_id)
        for delta in text.close():
            ticket.emit(delta)
        reason = FinishReason.STOP if over else u.finish
        assert reason is not None
        if reason is FinishReason.STOP and text.called_tools:
            reason = FinishReason.TOOL_CALLS
        from_disk, miss = self._cache_notes.get(u.seq_id, (0, None))
        usage = Usage(
            len(ticket.request.prompt_tokens),
            u.num_generated,
            u.num_cached,
            u.drafted,
            u.accepted,
            ticket.request.prediction is not None,
            from_disk,
            miss,
        )
        timings = clock.timings(time.perf_counter()) if clock is not None else None
        ticket.emit(Finished(reason, usage, text.stops.matched, timings))
        self.counters.requests_finished += 1
        self._drop(u.seq_id)

    def _token_logprob(self, u: TokenUpdate) -> TokenLogprob | None:
        if u.logprobs is None:
            return None
        lp, top = u.logprobs
        decode = self.tokenizer.decode
        alternatives = tuple((decode([t]), v) for t, v in top if v > float("-inf"))  # not grammar-forbidden
        return TokenLogprob(decode([u.token]), lp, alternatives)
