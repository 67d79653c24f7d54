"""Tier 3, engine level: one stream stepped alone (Core._step_alone) on the real model.

While one plain row decodes and nothing else is asked of the engine, the core steps it without
the scheduler's plan (issue 19 item 1). These run `Core.serve` itself, as the engine process does,
with the real batch runner: the lone stream keeps mlx-lm's greedy tokens, and whatever else
happens — a request arriving, an abort, a stop string, a fault in the row — is taken up by the
planned loop within a step.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlx_serve.engine.batch.core import Core
from mlx_serve.engine.batch.core_parts import Ticket
from mlx_serve.engine.batch.runner import BatchRunner
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.errors import EngineFailed
from mlx_serve.engine.types import Counters, Event, Finished, FinishReason, Request, SamplingParams, TextDelta
from tests.engine.batch.test_runner import prompt_ids, reference


@pytest.fixture(scope="module")
def smollm(smollm_path: Path) -> tuple[Any, Any]:
    from mlx_lm import load

    from mlx_serve.engine.model.loader import maybe_dequantize

    model, tokenizer = load(str(smollm_path))
    return maybe_dequantize(model), tokenizer


class CountingRunner(BatchRunner):
    """The real runner, counting its lone steps and its planned ones."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.alone_steps = self.planned_steps = 0
        self.fault_after: int | None = None  # the row "bad" gets a processor raising on that call

    def step_alone(self) -> int:
        self.alone_steps += 1
        return super().step_alone()

    def step(self, plan: Any) -> Any:
        self.planned_steps += 1
        return super().step(plan)

    def admit(self, request: Request, cache: Any = None, num_cached: int = 0, constraint: Any = None) -> None:
        if request.id == "bad" and self.fault_after is not None:
            calls = iter(range(1, 1 << 30))
            after = self.fault_after

            def processor(tokens: mx.array, logits: mx.array) -> mx.array:
                if next(calls) >= after:
                    raise RuntimeError("injected fault in a logits processor")
                return logits

            constraint = processor
        super().admit(request, cache, num_cached, constraint)


class Stream:
    """One request's events, as its consumer sees them."""

    def __init__(self, request: Request, on_event: Callable[[Stream, Event | Any], None]) -> None:
        self.request = request
        self.tokens: list[int] = []
        self.text: list[str] = []
        self.end: Any = None
        self._on_event = on_event
        self.ticket = Ticket(request, self.emit)

    def emit(self, ev: Any) -> None:
        if isinstance(ev, TextDelta):
            self.tokens.extend(ev.token_ids)
            self.text.append(ev.text)
        elif isinstance(ev, Finished | EngineFailed):
            self.end = ev
        self._on_event(self, ev)


def make_core(smollm: tuple[Any, Any]) -> tuple[Core, CountingRunner]:
    model, tokenizer = smollm
    runner = CountingRunner(model)
    sched = Scheduler(SchedulerConfig(), frozenset(tokenizer.eos_token_ids))
    return Core(sched, runner, tokenizer, Counters()), runner


def request(tokenizer: Any, rid: str, question: str, n: int, stop: tuple[str, ...] = ()) -> Request:
    return Request(rid, prompt_ids(tokenizer, question), SamplingParams(), n, stop=stop)


def greedy(smollm: tuple[Any, Any], r: Request) -> list[int]:
    model, tokenizer = smollm
    return reference(model, r.prompt_tokens, r.max_tokens, set(tokenizer.eos_token_ids))


def assert_greedy(s: Stream, smollm: tuple[Any, Any]) -> None:
    """The stream's text and token count are mlx-lm's greedy answer's (a token whose text is
    held back, as a partial UTF-8 character is, carries no delta of its own)."""
    want = greedy(smollm, s.request)
    assert isinstance(s.end, Finished), s.end
    assert "".join(s.text) == smollm[1].decode(want), s.request.id
    assert s.end.usage.completion_tokens == len(want), s.request.id


def test_a_lone_stream_steps_alone_and_keeps_mlx_lm_greedy_tokens(smollm: tuple[Any, Any]) -> None:
    core, runner = make_core(smollm)
    inbox: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
    r = request(smollm[1], "r0", "Write a haiku about rain.", 24)

    def on_event(s: Stream, ev: Any) -> None:
        if s.end is not None:
            inbox.put(None)

    s = Stream(r, on_event)
    inbox.put(s.ticket)
    core.serve(inbox)
    assert isinstance(s.end, Finished) and s.end.reason is FinishReason.LENGTH
    assert s.tokens == greedy(smollm, r)
    assert s.end.usage.completion_tokens == 24
    # the first token comes from the step that prefills; every later one from a lone step
    assert runner.alone_steps == 23 and runner.planned_steps == 1
    assert core.counters.engine_steps == 24 and core.counters.generated_tokens == 24
    settle(core)  # the finished row is released by the next planned step
    assert runner.num_rows == 0 and core.scheduler.kv_reserved == 0 and not core.tickets


def settle(core: Core) -> None:
    """The steps `serve` would take next with nothing arriving (releasing ended rows)."""
    while core.scheduler.has_work:
        core._step_guarded()


def test_a_request_arriving_during_a_lone_stream_joins_within_a_step(smollm: tuple[Any, Any]) -> None:
    core, runner = make_core(smollm)
    tokenizer = smollm[1]
    inbox: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
    order: list[str] = []  # whose token each text event carried, in order
    first = request(tokenizer, "r0", "Tell me a fact about cats.", 40)
    second = request(tokenizer, "r1", "Name three colors.", 8)
    streams: dict[str, Stream] = {}

    def on_event(s: Stream, ev: Any) -> None:
        if isinstance(ev, TextDelta) and ev.token_ids:
            order.append(s.request.id)
            if s.request.id == "r0" and len(s.tokens) == 6:
                streams["r1"] = Stream(second, on_event)
                inbox.put(streams["r1"].ticket)
        if all(x.end is not None for x in streams.values()) and len(streams) == 2:
            inbox.put(None)

    streams["r0"] = Stream(first, on_event)
    inbox.put(streams["r0"].ticket)
    core.serve(inbox)
    for s in streams.values():
        assert_greedy(s, smollm)
    # r1 was admitted by the step right after the one that saw it arrive: its first token
    # follows at most two more of r0's
    joined = order.index("r1")
    assert order[:joined].count("r0") <= 6 + 2
    # r0 stepped alone before r1 arrived and again after r1 had finished
    last_r1 = len(order) - 1 - order[::-1].index("r1")
    assert order[last_r1 + 1 :].count("r0") > 5
    assert runner.alone_steps >= 5 + order[last_r1 + 1 :].count("r0") - 1


def serve_then(
    core: Core, first: Request, after: Request, when: Callable[[Stream], bool]
) -> dict[str, Stream]:
    """Serve `first`; once `when(its stream)` holds (asked at each of its events; it may act, as
    a client that leaves does), submit `after`; return once `after` has ended."""
    inbox: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
    streams: dict[str, Stream] = {}

    def on_event(s: Stream, ev: Any) -> None:
        if s.request.id == first.id and after.id not in streams and when(s):
            streams[after.id] = Stream(after, on_event)
            inbox.put(streams[after.id].ticket)
        if s.request.id == after.id and s.end is not None:
            inbox.put(None)

    streams[first.id] = Stream(first, on_event)
    inbox.put(streams[first.id].ticket)
    core.serve(inbox)
    return streams


def test_an_abort_during_a_lone_stream_ends_it_within_a_step(smollm: tuple[Any, Any]) -> None:
    core, runner = make_core(smollm)
    tokenizer = smollm[1]

    def leaves_after_five(s: Stream) -> bool:
        if len(s.tokens) < 5:
            return False
        s.ticket.aborted.set()  # the client left (the engine client sets it from another thread)
        return True

    first = request(tokenizer, "r0", "Write a haiku about rain.", 64)
    streams = serve_then(core, first, request(tokenizer, "r1", "What is 2+2?", 6), leaves_after_five)
    assert len(streams["r0"].tokens) <= 6 and streams["r0"].end is None  # no more than one step late
    assert core.counters.requests_aborted == 1
    assert_greedy(streams["r1"], smollm)
    settle(core)
    assert runner.num_rows == 0 and core.scheduler.kv_reserved == 0 and not core.tickets


def test_a_stop_string_ends_a_lone_stream_and_frees_its_row(smollm: tuple[Any, Any]) -> None:
    tokenizer = smollm[1]
    probe = request(tokenizer, "probe", "Write a haiku about rain.", 32)
    tokens = greedy(smollm, probe)
    text = tokenizer.decode(tokens)
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # a piece of the greedy answer's middle
    assert stop.strip() and stop in text
    core, runner = make_core(smollm)
    inbox: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()

    def on_event(s: Stream, ev: Any) -> None:
        if s.end is not None:
            inbox.put(None)

    s = Stream(request(tokenizer, "r0", "Write a haiku about rain.", 32, stop=(stop,)), on_event)
    inbox.put(s.ticket)
    core.serve(inbox)
    assert isinstance(s.end, Finished) and s.end.reason is FinishReason.STOP and s.end.stop_sequence == stop
    assert "".join(s.text) == text[: text.index(stop)]
    assert runner.alone_steps > 0 and s.end.usage.completion_tokens < 32
    settle(core)
    assert runner.num_rows == 0 and core.scheduler.kv_reserved == 0 and not core.tickets


def test_a_fault_in_a_lone_rows_processor_fails_it_alone(smollm: tuple[Any, Any]) -> None:
    core, runner = make_core(smollm)
    runner.fault_after = 6  # its processor raises on its sixth call: in a lone step
    tokenizer = smollm[1]
    first = request(tokenizer, "bad", "Write a haiku about rain.", 32)
    after = request(tokenizer, "r1", "Say hello in Spanish.", 8)
    streams = serve_then(core, first, after, lambda s: s.end is not None)
    bad = streams["bad"]
    assert isinstance(bad.end, EngineFailed) and "injected fault" in bad.end.message
    assert runner.alone_steps >= 4 and len(bad.tokens) < 32
    assert_greedy(streams["r1"], smollm)
    assert core.counters.requests_failed == 1 and core.counters.requests_finished == 1
    settle(core)
    assert runner.num_rows == 0 and core.scheduler.kv_reserved == 0 and not core.tickets
