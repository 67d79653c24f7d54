"""Tier 1: the owner-thread loop with the real scheduler and the scripted fake runner."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from mlx_serve.engine.batch.core import Core
from mlx_serve.engine.batch.core_parts import Ticket
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.errors import EngineFailed, ServeError
from mlx_serve.engine.types import (
    Admitted,
    Counters,
    Emitted,
    EngineTimings,
    Event,
    Finished,
    FinishReason,
    Request,
    TextDelta,
    ToolCallStart,
    Usage,
)
from tests.support.fake_engine import EOS, FakeTokenizer, Fault, ScriptedRunner

TIMEOUT_S = 5.0


@dataclass(slots=True)
class Client:
    """One ticket's consumer: everything the core emits for it, in order."""

    request: Request
    events: queue.Queue[Emitted | ServeError] = field(default_factory=queue.Queue)
    ticket: Ticket = field(init=False)
    timings: EngineTimings | None = None
    admitted: list[Admitted] = field(default_factory=list)  # the server's notes, apart

    def __post_init__(self) -> None:
        self.ticket = Ticket(self.request, self.events.put)

    def next(self) -> Event | ServeError:
        while isinstance(ev := self.events.get(timeout=TIMEOUT_S), Admitted):
            self.admitted.append(ev)
        return ev

    def until_end(self) -> tuple[str, Finished | ServeError]:
        text = ""
        while not isinstance(ev := self.next(), Finished | ServeError):
            assert isinstance(ev, TextDelta)
            text += ev.text
        if isinstance(ev, Finished):
            self.timings = ev.timings
            return text, replace(ev, timings=None)  # timings are checked on their own
        return text, ev


@dataclass(slots=True)
class Harness:
    core: Core
    runner: ScriptedRunner
    inbox: queue.SimpleQueue[Ticket | None] = field(default_factory=queue.SimpleQueue)

    @property
    def scheduler(self) -> Scheduler:
        return self.core.scheduler

    def submit(self, request: Request) -> Client:
        client = Client(request)
        self.inbox.put(client.ticket)
        return client


def make(runner: ScriptedRunner, **config: int) -> Harness:
    scheduler = Scheduler(SchedulerConfig(**config), frozenset({EOS}))
    return Harness(Core(scheduler, runner, FakeTokenizer(runner.pieces), Counters()), runner)


@contextmanager
def serving(h: Harness) -> Iterator[Harness]:
    thread = threading.Thread(target=h.core.serve, args=(h.inbox,), daemon=True)
    thread.start()
    try:
        yield h
    finally:
        h.inbox.put(None)
        thread.join(TIMEOUT_S)
        assert not thread.is_alive()


def wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


def req(seq_id: str, max_tokens: int = 100, stop: tuple[str, ...] = ()) -> Request:
    return Request(seq_id, (5, 6, 7), max_tokens=max_tokens, stop=stop)


def idle(h: Harness) -> bool:
    return not h.scheduler.has_work and not h.runner.rows and h.scheduler.kv_reserved == 0


def test_core_streams_pieces_then_finishes_on_eos() -> None:
    h = make(ScriptedRunner(["He", "llo", "!"]))
    with serving(h):
        client = h.submit(req("a"))
        text, end = client.until_end()
        wait_until(lambda: idle(h))
    assert text == "Hello!"
    assert end == Finished(FinishReason.STOP, Usage(3, 4, 0))  # three pieces, then EOS
    assert client.admitted == [Admitted(0)]  # the server's note at admission: nothing cached
    t = client.timings  # the trace's engine phases: admission wait, one prefill chunk, first token
    assert t is not None and len(t.prefill_chunks) == 1 and t.prefill_chunks[0][0] == 3
    assert t.first_token_s is not None and 0 <= t.admitted_s <= t.first_token_s <= t.finished_s
    assert t.first_delta_s is not None and t.first_token_s <= t.first_delta_s <= t.finished_s
    assert h.runner.steps_taken == [4]
    assert (h.core.counters.requests_started, h.core.counters.requests_finished) == (1, 1)
    assert not h.core.tickets and not h.core.texts


def test_core_max_tokens_finishes_with_length() -> None:
    h = make(ScriptedRunner(["a", "b", "c", "d"]))
    with serving(h):
        text, end = h.submit(req("a", max_tokens=2)).until_end()
        wait_until(lambda: idle(h))
    assert (text, end) == ("ab", Finished(FinishReason.LENGTH, Usage(3, 2, 0)))


def test_core_stop_string_across_tokens_finishes_the_row_and_releases_it() -> None:
    h = make(ScriptedRunner(["he", "llo", " wo", "rld", "!"]))
    with serving(h):
        other = h.submit(req("b"))
        text, end = h.submit(req("a", stop=("o w",))).until_end()
        wait_until(lambda: "a" not in h.runner.rows)
        assert other.until_end() == ("hello world!", Finished(FinishReason.STOP, Usage(3, 6, 0)))
        wait_until(lambda: idle(h))
    assert text == "hell"
    assert end == Finished(FinishReason.STOP, Usage(3, 3, 0), "o w")
    # The stopped row is released on the next step: it never decodes a fourth token.
    assert sorted(h.runner.steps_taken) == [3, 6]


def test_core_held_back_partial_stop_is_flushed_when_the_row_ends() -> None:
    h = make(ScriptedRunner(["a", "</", "en"]))
    with serving(h):
        text, end = h.submit(req("a", max_tokens=3, stop=("</end>",))).until_end()
    assert (text, end) == ("a</en", Finished(FinishReason.LENGTH, Usage(3, 3, 0)))


def test_core_reaps_an_aborted_ticket_and_serves_the_next() -> None:
    h = make(ScriptedRunner(["x"] * 100_000, step_s=0.001))
    with serving(h):
        first = h.submit(req("a", max_tokens=100_000))
        assert first.next() == TextDelta("x", (1,))
        first.ticket.aborted.set()
        wait_until(lambda: idle(h) and h.core.counters.requests_aborted == 1)
        text, end = h.submit(req("b", max_tokens=2)).until_end()
    assert (text, end) == ("xx", Finished(FinishReason.LENGTH, Usage(3, 2, 0)))
    while not first.events.empty():
        assert isinstance(first.events.get(), TextDelta)  # no Finished for an aborted ticket
    assert h.runner.steps_taken[0] >= 1 and h.core.counters.requests_finished == 1


def test_core_drops_a_ticket_aborted_before_it_is_accepted() -> None:
    h = make(ScriptedRunner(["x"]))
    early = h.submit(req("a"))
    early.ticket.aborted.set()
    with serving(h):
        assert h.submit(req("b")).until_end()[0] == "x"
    assert early.events.empty()
    assert h.core.counters.requests_aborted == 1 and h.core.counters.requests_started == 1


def test_core_takes_every_ticket_the_gate_let_through() -> None:
    # One admission owner: the engine client's Gate bounds running + waiting before any byte;
    # the core never refuses a ticket in-band for the queue's length (issue 15, item 6).
    h = make(ScriptedRunner(["x"]), max_running=1)
    clients = [h.submit(req(f"r{i}")) for i in range(80)]
    with serving(h):
        ends = [c.until_end() for c in clients]
    assert ends == [("x", Finished(FinishReason.STOP, Usage(3, 2, 0)))] * 80


PIECES = ["a", "b", "c", "d"]


def faulty_batch(fault: Fault, *, tools: bool = False) -> tuple[Harness, list[Client], Client]:
    """Three healthy rows and one faulty row ("bad"), submitted together."""
    h = make(ScriptedRunner(PIECES, faults={"bad": fault}))
    clients = [h.submit(req(name, max_tokens=4)) for name in ("a", "b")]
    bad = Request("bad", (5, 6, 7), max_tokens=4, tools=({"function": {"name": "f"}},) if tools else None)
    return h, clients + [h.submit(bad), h.submit(req("c", max_tokens=4))], clients[0]


@pytest.mark.parametrize(
    "fault",
    [
        Fault("admit"),
        Fault("prefill"),
        Fault("decode", at=2),
        Fault("token", at=1, token=999),  # a token id the detokenizer has no piece for
    ],
    ids=["admit", "prefill", "decode", "detokenize"],
)
def test_core_fault_in_one_row_fails_that_row_only(fault: Fault) -> None:
    h, clients, _ = faulty_batch(fault)
    with serving(h):
        ends = {c.request.id: c.until_end() for c in clients}
        wait_until(lambda: idle(h))
        after = h.submit(req("after", max_tokens=4)).until_end()  # the engine serves on
    _partial, error = ends.pop("bad")
    assert isinstance(error, EngineFailed) and error.status == 500
    assert "generation failed" in error.message
    healthy = ("abcd", Finished(FinishReason.LENGTH, Usage(3, 4, 0)))
    assert ends == {"a": healthy, "b": healthy, "c": healthy} and after == healthy
    assert h.runner.resets == 0  # no batch-wide failure: the runner kept every other row
    assert h.core.counters.requests_failed == 1
    assert not h.core.tickets and not h.core.texts and h.scheduler.kv_reserved == 0


def test_core_fault_in_one_rows_tool_parsing_fails_that_row_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlx_serve.engine.tools.splitter import ToolCallSplitter

    feed = ToolCallSplitter.feed

    def exploding_feed(self: ToolCallSplitter, text: str) -> list[Any]:
        if "b" in text:
            raise ValueError("injected fault in tool-call parsing")
        return feed(self, text)

    monkeypatch.setattr(ToolCallSplitter, "feed", exploding_feed)
    h, clients, _ = faulty_batch(Fault("none"), tools=True)
    with serving(h):
        ends = {c.request.id: c.until_end() for c in clients}
    _partial, error = ends.pop("bad")
    assert isinstance(error, EngineFailed) and "tool-call parsing" in error.message
    assert all(text == "abcd" for text, _ in ends.values())
    assert h.runner.resets == 0


def test_core_runner_fault_fails_every_in_flight_ticket_and_serves_the_next() -> None:
    h = make(ScriptedRunner(["a", "b", "c", "d"], fail_after=2))
    clients = [h.submit(req(name)) for name in ("a", "b")]
    with serving(h):
        ends = [c.until_end() for c in clients]
        wait_until(lambda: idle(h))
        h.runner.fail_after = None
        text, end = h.submit(req("c")).until_end()
    for partial, error in ends:
        assert partial == "ab"
        assert isinstance(error, EngineFailed) and error.status == 500
        assert error.message == "generation failed: RuntimeError: simulated engine fault"
    assert h.core.counters.requests_failed == 2
    assert (text, end) == ("abcd", Finished(FinishReason.STOP, Usage(3, 5, 0)))


def test_core_gauges_running_waiting_and_kv_usage() -> None:
    h = make(ScriptedRunner([f"t{i}" for i in range(50)], step_s=0.01), max_running=1)
    h.scheduler.config.kv_capacity_tokens = 1000
    with serving(h):
        first, second = h.submit(req("a", max_tokens=40)), h.submit(req("b", max_tokens=40))
        wait_until(lambda: h.core.counters.num_requests_waiting == 1 and h.core.counters.generated_tokens > 2)
        c = h.core.counters
        assert c.num_requests_running == 1 and 0 < c.kv_cache_usage_perc < 0.05
        first.until_end()
        second.until_end()
        wait_until(lambda: idle(h) and h.core.counters.num_requests_running == 0)
    assert h.core.counters.num_requests_waiting == 0 and h.core.counters.kv_cache_usage_perc == 0


def test_core_stops_a_row_whose_model_repeats_its_tool_call() -> None:
    # The splitter ends the answer at a repeated call: the row stops there (finish tool_calls,
    # its slot freed), it does not run on to max_tokens writing the same call again.
    call = ["<tool_call>", '{"name": "f", "arguments": {}}', "</tool_call>"]
    h = make(ScriptedRunner(call * 10))
    with serving(h):
        client = h.submit(Request("t", (5, 6, 7), max_tokens=100, tools=({"function": {"name": "f"}},)))
        events: list[Event | ServeError] = []
        while not isinstance(ev := client.next(), Finished | ServeError):
            events.append(ev)
        wait_until(lambda: idle(h))
    assert [e.name for e in events if isinstance(e, ToolCallStart)] == ["f"]  # the repeat is dropped
    assert isinstance(ev, Finished) and ev.reason is FinishReason.TOOL_CALLS
    stopped_at = len(call) + 2  # the second call's JSON: its end marker is not awaited
    assert ev.usage.completion_tokens == stopped_at
    assert h.runner.steps_taken == [stopped_at] and h.scheduler.kv_reserved == 0


class ScriptedIdleWork:
    """Idle work of `units` steps that records when each ran, whether a row was in the engine
    then, and when the core paused it."""

    def __init__(self, h: Harness, units: int, fail_at: int | None = None) -> None:
        self.h, self.left, self.fail_at = h, units, fail_at
        self.ran: list[tuple[float, bool]] = []
        self.paused_at: list[tuple[float, int]] = []  # when, and after how many units
        self.started = threading.Event()

    def step(self) -> bool:
        if self.fail_at is not None and len(self.ran) == self.fail_at:
            raise RuntimeError("a kernel would not compile")
        self.started.set()
        self.ran.append((time.monotonic(), self.h.scheduler.has_work or bool(self.h.runner.rows)))
        time.sleep(0.005)
        self.left -= 1
        return self.left > 0

    def pause(self) -> None:
        self.paused_at.append((time.monotonic(), len(self.ran)))


def test_core_runs_idle_work_only_while_no_request_is_in_the_engine() -> None:
    # The GPU warm-up is idle work: one unit (a batch step) per pass of the loop, never while a
    # row is in the engine, so a request that arrives mid-warm-up is served at once — the work is
    # paused first, to free what it holds — and the warm-up resumes after. It waits for
    # idle_after_s without a step, so a client's next request does not find a unit under way.
    h = make(ScriptedRunner(["He", "llo", "!"], step_s=0.01))
    h.core.idle_after_s = 0.2
    work = ScriptedIdleWork(h, 40)
    h.core.idle_work = work
    with serving(h):
        assert work.started.wait(TIMEOUT_S)
        submitted = time.monotonic()
        client = h.submit(req("a"))
        text, end = client.until_end()
        answered, units_by_the_answer = time.monotonic(), len(work.ran)
        wait_until(lambda: h.core.idle_work is None)
    assert text == "Hello!" and isinstance(end, Finished)
    assert units_by_the_answer < 40  # the request did not wait for the whole warm-up
    assert len(work.ran) == 40 and not any(busy for _, busy in work.ran)
    assert [n for at, n in work.paused_at if at >= submitted] == [
        units_by_the_answer
    ]  # paused once, on arrival
    after = [at for at, _ in work.ran[units_by_the_answer:]]
    assert after[0] >= answered + 0.15  # idle work resumed only once the engine had been idle a while


def test_core_serves_on_when_its_idle_work_fails() -> None:
    h = make(ScriptedRunner(["ok"]))
    h.core.idle_work = ScriptedIdleWork(h, 10, fail_at=1)
    with serving(h):
        wait_until(lambda: h.core.idle_work is None)
        text, end = h.submit(req("a")).until_end()
    assert text == "ok" and isinstance(end, Finished)


def test_core_counts_its_steps_rows_and_joins() -> None:
    # /stats and /metrics: how full the batch ran and how many steps carried prefill.
    h = make(ScriptedRunner([f"t{i}" for i in range(20)]))
    a, b = req("a", max_tokens=5), req("b", max_tokens=3)
    clients = [h.submit(a), h.submit(b)]
    with serving(h):
        for client in clients:
            client.until_end()
        wait_until(lambda: idle(h))
    c = h.core.counters
    # step 1 prefills both (each samples its first token); then both decode for two steps and
    # "a" alone for two more
    assert (c.engine_steps, c.engine_join_steps, c.engine_step_rows) == (5, 1, 2 + 2 + 1 + 1)
    assert c.engine_step_seconds >= c.engine_join_step_seconds > 0
