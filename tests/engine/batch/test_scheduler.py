"""Tier 1: the continuous-batching scheduler driven by a fake runner that checks every plan."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig, SeqState
from mlx_serve.engine.rows.step_records import PrefillChunk, StepOutput, StepPlan, TokenUpdate
from mlx_serve.engine.types import FinishReason, Request

EOS = 0
TOKEN = 7

Script = Callable[[str, int], int]


def req(seq_id: str, prompt_len: int = 4, max_tokens: int = 100) -> Request:
    return Request(seq_id, tuple(range(1, prompt_len + 1)), max_tokens=max_tokens)


def plan_tokens(plan: StepPlan) -> int:
    return sum(c.end - c.start for c in plan.prefill) + len(plan.decode)


@dataclass(slots=True)
class FakeRunner:
    """Holds rows the way a real runner would and fails on any plan that breaks the contract.

    A row's k-th sampled token (k from 0) is `script(seq_id, k)`; tokens come for decode rows
    and for rows whose final prompt chunk ran this step, never for anyone else.
    """

    scheduler: Scheduler
    script: Script = lambda _s, _k: TOKEN
    computed: dict[str, int] = field(default_factory=dict)
    prompt_len: dict[str, int] = field(default_factory=dict)
    decoding: set[str] = field(default_factory=set)
    sampled: dict[str, int] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)

    def step(self, plan: StepPlan) -> StepOutput:
        for seq_id in plan.release:
            assert seq_id in self.computed, f"release of a row the runner never held: {seq_id}"
            del self.computed[seq_id]
            self.decoding.discard(seq_id)
            self.released.append(seq_id)
        for seq_id in plan.admitted:
            seq = self.scheduler.get(seq_id)
            assert seq is not None and seq_id not in self.computed and seq_id not in self.released
            self.computed[seq_id], self.prompt_len[seq_id] = seq.num_cached, seq.prompt_len
        out: dict[str, int] = {}
        for chunk in plan.prefill:
            self._prefill(chunk)
            if chunk.final:
                out[chunk.seq_id] = self._sample(chunk.seq_id)
        assert len(set(plan.decode)) == len(plan.decode), "a row decoded twice in one step"
        for seq_id in plan.decode:
            assert seq_id in self.decoding and seq_id not in out, f"decode of a row not decoding: {seq_id}"
            out[seq_id] = self._sample(seq_id)
        return StepOutput(out)

    def _prefill(self, chunk: PrefillChunk) -> None:
        seq_id = chunk.seq_id
        assert seq_id in self.computed and seq_id not in self.decoding, f"chunk for no prefill: {chunk}"
        assert chunk.start == self.computed[seq_id] < chunk.end <= self.prompt_len[seq_id], chunk
        assert chunk.final == (chunk.end == self.prompt_len[seq_id]), chunk
        self.computed[seq_id] = chunk.end
        if chunk.final:
            self.decoding.add(seq_id)

    def _sample(self, seq_id: str) -> int:
        k = self.sampled.get(seq_id, 0)
        self.sampled[seq_id] = k + 1
        return self.script(seq_id, k)


def make(
    cached: Callable[[Request], int] | None = None, script: Script | None = None, **config: int | None
) -> tuple[Scheduler, FakeRunner]:
    # Small budgets in these tests: keep the row limit within the budget (as the scheduler requires).
    config.setdefault("max_running", min(32, config.get("token_budget") or 2048))
    sched = Scheduler(SchedulerConfig(**config), frozenset({EOS}), cached)  # type: ignore[arg-type]
    runner = FakeRunner(sched) if script is None else FakeRunner(sched, script)
    return sched, runner


def step(sched: Scheduler, runner: FakeRunner) -> tuple[StepPlan, list[TokenUpdate]]:
    plan = sched.schedule()
    assert plan_tokens(plan) <= sched.config.token_budget, plan
    return plan, sched.update(plan, runner.step(plan))


def eos_at(k_eos: int) -> Script:
    return lambda _s, k: EOS if k == k_eos else TOKEN


def decode_ready(sched: Scheduler, runner: FakeRunner, *ids: str) -> None:
    """Prefill every given (short) request so that each is decoding."""
    while not all((s := sched.get(i)) is not None and s.state is SeqState.DECODING for i in ids):
        step(sched, runner)


# -- join / leave -------------------------------------------------------------------------


def test_scheduler_admits_a_request_added_while_others_decode_on_the_next_schedule() -> None:
    sched, runner = make(token_budget=16)
    sched.add(req("a"))
    decode_ready(sched, runner, "a")
    step(sched, runner)
    sched.add(req("b", prompt_len=6))
    plan = sched.schedule()
    assert plan.admitted == ("b",)
    assert plan.prefill == (PrefillChunk("b", 0, 6, True),)
    assert plan.decode == ("a",)


def test_scheduler_joins_decoding_the_step_its_final_chunk_runs() -> None:
    sched, runner = make(token_budget=16)
    sched.add(req("a", prompt_len=5))
    plan, updates = step(sched, runner)
    assert plan.admitted == ("a",) and plan.decode == ()
    assert updates == [TokenUpdate("a", TOKEN, None, 1, 0)]
    seq = sched.get("a")
    assert seq is not None and seq.state is SeqState.DECODING and seq.num_computed == 5
    plan, updates = step(sched, runner)
    assert plan.prefill == () and plan.decode == ("a",)
    assert updates == [TokenUpdate("a", TOKEN, None, 2, 0)]


def test_scheduler_idle_plan_is_empty_and_has_no_work() -> None:
    sched, runner = make()
    assert not sched.has_work and sched.schedule().empty
    sched.add(req("a", max_tokens=1))
    step(sched, runner)
    assert sched.has_work  # the release is still owed to the runner
    plan, _ = step(sched, runner)
    assert plan.release == ("a",) and not sched.has_work and sched.schedule().empty


def leave_and_release(sched: Scheduler, runner: FakeRunner, seq_id: str) -> list[StepPlan]:
    plans = [step(sched, runner)[0] for _ in range(4)]
    assert [p.release for p in plans] == [(seq_id,), (), (), ()]
    assert all(seq_id not in p.decode for p in plans)
    assert sched.get(seq_id) is None and runner.released == [seq_id]
    return plans


def test_scheduler_eos_finishes_with_stop_and_releases_once() -> None:
    sched, runner = make(script=lambda s, k: EOS if (s, k) == ("a", 2) else TOKEN)
    sched.add(req("a", max_tokens=100))
    sched.add(req("b", max_tokens=100))
    updates = [u for _ in range(3) for u in step(sched, runner)[1] if u.seq_id == "a"]
    assert [(u.token, u.finish, u.num_generated) for u in updates] == [
        (TOKEN, None, 1),
        (TOKEN, None, 2),
        (EOS, FinishReason.STOP, 3),
    ]
    plans = leave_and_release(sched, runner, "a")
    assert all(p.decode == ("b",) for p in plans)


def test_scheduler_max_tokens_finishes_with_length_and_releases_once() -> None:
    sched, runner = make()
    sched.add(req("a", max_tokens=3))
    updates = [u for _ in range(3) for u in step(sched, runner)[1]]
    assert [(u.finish, u.num_generated) for u in updates] == [(None, 1), (None, 2), (FinishReason.LENGTH, 3)]
    leave_and_release(sched, runner, "a")


def test_scheduler_max_tokens_one_finishes_on_the_prefill_token() -> None:
    sched, runner = make()
    sched.add(req("a", max_tokens=1))
    plan, updates = step(sched, runner)
    assert plan.prefill[0].final
    assert updates == [TokenUpdate("a", TOKEN, FinishReason.LENGTH, 1, 0)]
    leave_and_release(sched, runner, "a")


def test_scheduler_eos_wins_over_length_on_the_last_token() -> None:
    sched, runner = make(script=eos_at(1))
    sched.add(req("a", max_tokens=2))
    updates = [u for _ in range(2) for u in step(sched, runner)[1]]
    assert updates[-1].finish is FinishReason.STOP


def test_scheduler_external_finish_releases_once_and_leaves_decode() -> None:
    sched, runner = make()
    sched.add(req("a"))
    decode_ready(sched, runner, "a")
    sched.finish("a")
    assert sched.kv_reserved == 0 and sched.num_active == 0
    leave_and_release(sched, runner, "a")


def test_scheduler_finish_of_an_ended_sequence_is_a_noop() -> None:
    sched, runner = make()
    sched.add(req("a", max_tokens=1))
    step(sched, runner)
    sched.finish("a")
    sched.finish("never-added")
    leave_and_release(sched, runner, "a")


def test_scheduler_releases_and_admits_into_the_freed_slot_in_one_plan() -> None:
    sched, runner = make(script=eos_at(1), max_running=1)
    sched.add(req("a"))
    sched.add(req("b"))
    step(sched, runner)
    step(sched, runner)
    plan = sched.schedule()
    assert plan.release == ("a",) and plan.admitted == ("b",)
    assert plan.prefill == (PrefillChunk("b", 0, 4, True),)


def test_scheduler_ignores_tokens_for_rows_that_are_not_decoding() -> None:
    sched, _ = make(token_budget=4)
    sched.add(req("a", prompt_len=10))
    plan = sched.schedule()
    assert sched.update(plan, StepOutput({"a": TOKEN, "ghost": TOKEN})) == []
    seq = sched.get("a")
    assert seq is not None and seq.num_generated == 0 and seq.num_computed == 4


# -- chunked prefill ----------------------------------------------------------------------


def test_scheduler_splits_a_long_prompt_into_budget_sized_chunks() -> None:
    sched, runner = make(token_budget=8)
    sched.add(req("a", prompt_len=20))
    chunks = [c for _ in range(3) for c in step(sched, runner)[0].prefill]
    assert chunks == [
        PrefillChunk("a", 0, 8, False),
        PrefillChunk("a", 8, 16, False),
        PrefillChunk("a", 16, 20, True),
    ]


def test_scheduler_prompt_of_exactly_the_budget_is_one_final_chunk() -> None:
    sched, runner = make(token_budget=8)
    sched.add(req("a", prompt_len=8))
    assert step(sched, runner)[0].prefill == (PrefillChunk("a", 0, 8, True),)


def test_scheduler_decodes_running_rows_in_every_step_of_a_long_prefill() -> None:
    sched, runner = make(token_budget=8)
    sched.add(req("d1", prompt_len=2))
    sched.add(req("d2", prompt_len=2))
    decode_ready(sched, runner, "d1", "d2")
    sched.add(req("long", prompt_len=20))
    plans = [step(sched, runner)[0] for _ in range(4)]
    assert [p.prefill for p in plans] == [
        (PrefillChunk("long", 0, 6, False),),
        (PrefillChunk("long", 6, 12, False),),
        (PrefillChunk("long", 12, 18, False),),
        (PrefillChunk("long", 18, 20, True),),
    ]
    assert all(p.decode == ("d1", "d2") and plan_tokens(p) <= 8 for p in plans)
    assert step(sched, runner)[0].decode == ("d1", "d2", "long")


def test_scheduler_gives_prefill_only_what_decode_rows_leave_of_the_budget() -> None:
    sched, runner = make(
        script=lambda s, k: EOS if (s, k) == ("d1", 2) else TOKEN, token_budget=3, max_running=3
    )
    sched.add(req("d1", prompt_len=1))
    sched.add(req("d2", prompt_len=1))
    decode_ready(sched, runner, "d1", "d2")
    sched.add(req("p", prompt_len=6))
    plan, _ = step(sched, runner)
    assert plan.admitted == ("p",) and plan.decode == ("d1", "d2")
    assert plan.prefill == (PrefillChunk("p", 0, 1, False),)
    plan, _ = step(sched, runner)  # d1 hits EOS here
    assert plan.prefill == (PrefillChunk("p", 1, 2, False),) and plan.decode == ("d1", "d2")
    plan, _ = step(sched, runner)
    assert plan.release == ("d1",) and plan.decode == ("d2",)
    assert plan.prefill == (PrefillChunk("p", 2, 4, False),)


# -- one token budget, several prefilling sequences, limits ----------------------------


def test_scheduler_shares_the_budget_fifo_across_prefilling_sequences() -> None:
    sched, runner = make(token_budget=10, max_prefilling=3)
    sched.add(req("d", prompt_len=2))
    decode_ready(sched, runner, "d")
    for name in ("p1", "p2", "p3"):
        sched.add(req(name, prompt_len=4))
    plan, _ = step(sched, runner)
    assert plan.decode == ("d",)
    assert plan.prefill == (
        PrefillChunk("p1", 0, 4, True),
        PrefillChunk("p2", 0, 4, True),
        PrefillChunk("p3", 0, 1, False),
    )
    assert plan_tokens(plan) == 10
    plan, _ = step(sched, runner)
    assert plan.decode == ("d", "p1", "p2") and plan.prefill == (PrefillChunk("p3", 1, 4, True),)


def test_scheduler_respects_max_prefilling() -> None:
    sched, runner = make(token_budget=16, max_prefilling=2)
    for name in ("a", "b", "c"):
        sched.add(req(name, prompt_len=40))
    admitted: list[tuple[int, str]] = []
    for i in range(8):
        plan, _ = step(sched, runner)
        admitted += [(i, s) for s in plan.admitted]
        assert len(sched.prefilling) <= 2
        if any(c.seq_id == "a" and c.final for c in plan.prefill):
            a_done = i
    # a's last chunk runs in step 2; c is admitted on the very next schedule.
    assert a_done == 2 and admitted == [(0, "a"), (0, "b"), (3, "c")]


def test_scheduler_max_running_counts_prefilling_and_decoding() -> None:
    sched, runner = make(script=eos_at(2), max_running=2)
    for name in ("a", "b", "c"):
        sched.add(req(name))
    plan, _ = step(sched, runner)
    assert plan.admitted == ("a", "b") and [s.id for s in sched.waiting] == ["c"]
    plan, _ = step(sched, runner)
    assert plan.admitted == () and sched.num_active == 2
    plan, _ = step(sched, runner)  # a and b hit EOS here
    assert plan.admitted == ()
    plan = sched.schedule()
    assert plan.release == ("a", "b") and plan.admitted == ("c",)


def test_scheduler_refuses_more_running_rows_than_the_token_budget() -> None:
    # Decode rows are never deferred, so with max_running > token_budget a plan can exceed the
    # budget and prompts starve while ≥ token_budget rows decode (--prefill-step-size 16 with the
    # default --decode-concurrency 32 does this). max_running ≤ token_budget keeps both promises.
    with pytest.raises(ValueError, match="token_budget"):
        Scheduler(SchedulerConfig(max_running=4, token_budget=2), frozenset({EOS}))


# -- fairness -----------------------------------------------------------------------------


def test_scheduler_admits_in_fifo_order() -> None:
    sched, runner = make(script=eos_at(0), max_running=1)
    names = ["r3", "r1", "r4", "r0", "r2"]
    for name in names:
        sched.add(req(name))
    admitted = [s for _ in range(12) for s in step(sched, runner)[0].admitted]
    assert admitted == names


def test_scheduler_later_short_request_does_not_overtake_in_admission() -> None:
    sched, runner = make(script=lambda s, k: EOS if (s, k) == ("r", 3) else TOKEN, kv_capacity_tokens=100)
    sched.add(req("r", prompt_len=10, max_tokens=40))
    decode_ready(sched, runner, "r")
    sched.add(req("big", prompt_len=30, max_tokens=30))
    sched.add(req("small", prompt_len=2, max_tokens=2))
    plans = [step(sched, runner)[0] for _ in range(3)]  # r hits EOS in the last of these
    assert all(p.admitted == () for p in plans)
    assert [s.id for s in sched.waiting] == ["big", "small"]
    plan = sched.schedule()
    # The batch pads rows to its longest: big (60) and small together would hold 2 × 60 > 100.
    assert plan.release == ("r",) and plan.admitted == ("big",)
    assert [s.id for s in sched.waiting] == ["small"]


def test_scheduler_prefills_in_fifo_order() -> None:
    sched, runner = make(token_budget=8)
    sched.add(req("a", prompt_len=12))
    sched.add(req("b", prompt_len=4))
    plan, _ = step(sched, runner)
    assert plan.admitted == ("a", "b") and plan.prefill == (PrefillChunk("a", 0, 8, False),)
    plan, _ = step(sched, runner)
    assert plan.prefill == (PrefillChunk("a", 8, 12, True), PrefillChunk("b", 0, 4, True))


# -- KV capacity --------------------------------------------------------------------------


def test_scheduler_request_that_does_not_fit_waits_until_a_running_one_finishes() -> None:
    sched, runner = make(kv_capacity_tokens=20)
    sched.add(req("a", prompt_len=4, max_tokens=8))
    sched.add(req("b", prompt_len=4, max_tokens=8))
    plans = []
    for _ in range(7):
        plan, updates = step(sched, runner)
        plans.append(plan)
        assert sched.kv_reserved == 12 and [s.id for s in sched.waiting] == ["b"]
    plan, updates = step(sched, runner)
    plans.append(plan)
    assert updates[-1].finish is FinishReason.LENGTH and sched.kv_reserved == 0
    # Never evicted for room: a is decoded in every step after its prefill.
    assert all(p.decode == ("a",) for p in plans[1:])
    plan = sched.schedule()
    assert plan.release == ("a",) and plan.admitted == ("b",) and sched.kv_reserved == 12


def test_scheduler_admits_a_request_that_fills_the_capacity_exactly() -> None:
    sched, _ = make(kv_capacity_tokens=24)
    sched.add(req("a", prompt_len=4, max_tokens=8))
    sched.add(req("b", prompt_len=4, max_tokens=8))
    assert sched.schedule().admitted == ("a", "b") and sched.kv_reserved == 24


def test_scheduler_can_ever_fit() -> None:
    capped, _ = make(kv_capacity_tokens=20)
    assert capped.can_ever_fit(req("x", prompt_len=4, max_tokens=16))
    assert not capped.can_ever_fit(req("x", prompt_len=4, max_tokens=17))
    assert not capped.can_ever_fit(req("x", prompt_len=21, max_tokens=1))
    uncapped, _ = make()
    assert uncapped.can_ever_fit(req("x", prompt_len=100_000, max_tokens=100_000))


# -- no waiting queue bound here: the engine client's Gate is the one admission owner --------


def test_scheduler_add_never_refuses_for_the_queue_length() -> None:
    # The Gate already bounded running + waiting; a request the scheduler is given runs.
    sched, runner = make(max_running=1)
    for i in range(100):
        sched.add(req(f"r{i}", max_tokens=1))
    assert len(sched.waiting) == 100
    for _ in range(400):
        if not sched.has_work:
            break
        step(sched, runner)
    assert not sched.has_work and sched.kv_reserved == 0


# -- abort at every phase -----------------------------------------------------------------


def test_scheduler_abort_while_waiting_removes_it_without_a_release() -> None:
    sched, runner = make(max_running=1)
    sched.add(req("a"))
    sched.add(req("b"))
    step(sched, runner)
    assert sched.abort("b") is True
    assert sched.get("b") is None and not sched.waiting and sched.kv_reserved == 4 + 100
    plans = [step(sched, runner)[0] for _ in range(3)]
    assert all(p.release == () and p.admitted == () for p in plans)


def test_scheduler_abort_while_prefilling_releases_it_once() -> None:
    sched, runner = make(token_budget=4)
    sched.add(req("a", prompt_len=12))
    step(sched, runner)
    assert sched.abort("a") is True
    assert sched.kv_reserved == 0 and sched.num_active == 0
    plans = [step(sched, runner)[0] for _ in range(3)]
    assert [p.release for p in plans] == [("a",), (), ()]
    assert all(p.prefill == () for p in plans)


def test_scheduler_abort_while_decoding_releases_it_once() -> None:
    sched, runner = make()
    sched.add(req("a"))
    sched.add(req("b"))
    decode_ready(sched, runner, "a", "b")
    assert sched.abort("a") is True
    plans = leave_and_release(sched, runner, "a")
    assert all(p.decode == ("b",) for p in plans)


def test_scheduler_abort_of_a_finished_or_unknown_sequence_is_a_noop() -> None:
    sched, runner = make()
    sched.add(req("a", max_tokens=1))
    step(sched, runner)
    assert sched.abort("a") is False
    assert sched.abort("never-added") is False
    leave_and_release(sched, runner, "a")


def test_scheduler_second_abort_returns_false_and_releases_once() -> None:
    sched, runner = make()
    sched.add(req("a"))
    decode_ready(sched, runner, "a")
    assert sched.abort("a") is True and sched.abort("a") is False
    leave_and_release(sched, runner, "a")


def test_scheduler_abort_between_schedule_and_update_drops_that_steps_output() -> None:
    sched, runner = make(token_budget=8)
    sched.add(req("d"))
    decode_ready(sched, runner, "d")
    sched.add(req("p", prompt_len=4))
    plan = sched.schedule()
    assert plan.decode == ("d",) and plan.prefill == (PrefillChunk("p", 0, 4, True),)
    out = runner.step(plan)
    assert sched.abort("p") and sched.abort("d")
    assert sched.update(plan, out) == []
    assert sched.schedule().release == ("p", "d") and not sched.has_work


def test_scheduler_abort_frees_kv_for_a_waiting_request() -> None:
    sched, runner = make(kv_capacity_tokens=24)
    for name in ("a", "b", "c"):
        sched.add(req(name, prompt_len=4, max_tokens=8))
    step(sched, runner)
    assert sched.kv_reserved == 24 and [s.id for s in sched.waiting] == ["c"]
    sched.abort("a")
    assert sched.kv_reserved == 12
    plan, _ = step(sched, runner)
    assert plan.release == ("a",) and plan.admitted == ("c",)
    for name in ("b", "c"):
        sched.abort(name)
    assert sched.kv_reserved == 0
    assert step(sched, runner)[0].release == ("b", "c") and not sched.has_work


# -- cached prefix ------------------------------------------------------------------------


@pytest.mark.parametrize(("cached", "start"), [(0, 0), (5, 5), (9, 9), (10, 9), (50, 9)])
def test_scheduler_cached_prefix_leaves_at_least_one_token_to_prefill(cached: int, start: int) -> None:
    sched, runner = make(cached=lambda _r: cached, token_budget=16)
    sched.add(req("a", prompt_len=10))
    plan, updates = step(sched, runner)
    assert plan.prefill == (PrefillChunk("a", start, 10, True),)
    seq = sched.get("a")
    assert seq is not None and seq.num_cached == start
    assert updates == [TokenUpdate("a", TOKEN, None, 1, start)]


def test_scheduler_cached_prefix_is_looked_up_at_admission() -> None:
    seen: list[str] = []

    def cached(r: Request) -> int:
        seen.append(r.id)
        return 2

    sched, runner = make(cached=cached, max_running=1, script=eos_at(0))
    sched.add(req("a"))
    sched.add(req("b"))
    step(sched, runner)
    assert seen == ["a"]
    assert [c for _ in range(2) for c in step(sched, runner)[0].prefill] == [PrefillChunk("b", 2, 4, True)]
    assert seen == ["a", "b"]


# -- randomized property test -------------------------------------------------------------


@dataclass(slots=True)
class Traffic:
    """The test's own account of what must have happened, checked against the scheduler."""

    sched: Scheduler
    runner: FakeRunner
    rng: random.Random
    added: list[str] = field(default_factory=list)
    alive: set[str] = field(default_factory=set)
    ended: dict[str, str] = field(default_factory=dict)
    admitted: list[str] = field(default_factory=list)
    owed_release: set[str] = field(default_factory=set)
    released: set[str] = field(default_factory=set)
    generated: dict[str, int] = field(default_factory=dict)
    cached: dict[str, int] = field(default_factory=dict)
    requests: dict[str, Request] = field(default_factory=dict)
    add_order: dict[str, int] = field(default_factory=dict)
    uses_cache: bool = False
    next_id: int = 0
    max_waiting: int = 8

    def arrive(self) -> None:
        budget = self.sched.config.token_budget
        seq_id = f"r{self.next_id}"
        self.next_id += 1
        prompt_len = self.rng.randint(1, 3 * budget)
        request = req(seq_id, prompt_len, self.rng.randint(1, 12))
        self.cached[seq_id] = self.rng.choice([0, 0, self.rng.randint(0, prompt_len + 3)])
        if not self.sched.can_ever_fit(request):
            return  # admission would have refused it with a 400
        if len(self.sched.waiting) >= self.max_waiting:
            return  # the engine client's Gate would have answered 429
        self.sched.add(request)
        self.added.append(seq_id)
        self.alive.add(seq_id)
        self.requests[seq_id] = request
        self.add_order[seq_id] = len(self.added)

    def end(self, seq_id: str, how: str) -> None:
        assert seq_id not in self.ended, f"{seq_id} ended twice"
        assert self.sched.get(seq_id) is None
        if seq_id in self.admitted:
            self.owed_release.add(seq_id)
        self.ended[seq_id] = how
        self.alive.discard(seq_id)

    def interfere(self) -> None:
        rng = self.rng
        if self.alive and rng.random() < 0.08:
            victim = rng.choice(sorted(self.alive))
            assert self.sched.abort(victim) is True
            self.end(victim, "aborted")
        if self.ended and rng.random() < 0.05:
            assert self.sched.abort(rng.choice(sorted(self.ended))) is False
        decoding = sorted(s.id for s in self.sched.decoding)
        if decoding and rng.random() < 0.05:
            victim = rng.choice(decoding)
            self.sched.finish(victim)
            self.end(victim, "stopped")

    def step(self) -> None:
        sched = self.sched
        decoding_before = [s.id for s in sched.decoding]
        prefilling_before = {s.id for s in sched.prefilling}
        plan = sched.schedule()
        self.check_plan(plan, decoding_before, prefilling_before)
        out = self.runner.step(plan)
        if self.alive and self.rng.random() < 0.05:  # an abort lands while the step runs
            victim = self.rng.choice(sorted(self.alive))
            sched.abort(victim)
            self.end(victim, "aborted")
        joined = {c.seq_id for c in plan.prefill if c.final}
        updates = sched.update(plan, out)
        assert len({u.seq_id for u in updates}) == len(updates)
        for u in updates:
            assert u.seq_id in self.alive and (u.seq_id in plan.decode or u.seq_id in joined)
            assert u.token == out.tokens[u.seq_id]
            self.generated[u.seq_id] = self.generated.get(u.seq_id, 0) + 1
            assert u.num_generated == self.generated[u.seq_id]
            request = self.requests[u.seq_id]
            cached = min(self.cached[u.seq_id], len(request.prompt_tokens) - 1) if self.uses_cache else 0
            assert u.num_cached == cached
            max_tokens = request.max_tokens
            want = (
                FinishReason.STOP
                if u.token == EOS
                else FinishReason.LENGTH
                if u.num_generated == max_tokens
                else None
            )
            assert u.finish is want, (u, max_tokens)
            if u.finish is not None:
                self.end(u.seq_id, "finished")
        missing = (set(plan.decode) | joined) & self.alive - {u.seq_id for u in updates}
        assert not missing, f"sampled rows got no update: {missing}"
        self.check_state()

    def check_plan(self, plan: StepPlan, decoding_before: list[str], prefilling_before: set[str]) -> None:
        sched, cfg = self.sched, self.sched.config
        assert plan_tokens(plan) <= cfg.token_budget
        # Every decoding row runs every step: a stream never stalls for a prefill.
        assert list(plan.decode) == decoding_before
        assert sorted(plan.release) == sorted(self.owed_release)
        assert len(set(plan.release)) == len(plan.release)
        assert not set(plan.release) & self.released
        self.released |= set(plan.release)
        self.owed_release.clear()
        for seq_id in plan.admitted:
            assert seq_id in self.alive and seq_id not in self.admitted
            self.admitted.append(seq_id)
        # FIFO admission: admitted ids follow the order they were added in.
        order = [self.add_order[s] for s in self.admitted[-len(plan.admitted) - 1 :]]
        assert order == sorted(order)
        assert {s.id for s in sched.prefilling} == prefilling_before | set(plan.admitted)
        self.check_chunks(plan)
        if sched.waiting:  # work-conserving admission: the head is blocked by a limit
            head = sched.waiting[0]
            cap = cfg.kv_capacity_tokens
            active = [s.kv_tokens for s in (*sched.prefilling, *sched.decoding)]
            padded = (sched.num_active + 1) * max([head.kv_tokens, *active])
            assert (
                len(sched.prefilling) >= cfg.max_prefilling
                or sched.num_active >= cfg.max_running
                or (cap is not None and padded > cap)
            )

    def check_chunks(self, plan: StepPlan) -> None:
        sched = self.sched
        queue = list(sched.prefilling)
        assert [c.seq_id for c in plan.prefill] == [s.id for s in queue[: len(plan.prefill)]]
        for chunk, seq in zip(plan.prefill, queue, strict=False):
            assert chunk.start == seq.num_computed and chunk.final == (chunk.end == seq.prompt_len)
            assert chunk.start >= seq.num_cached
        # FIFO prefill: only the last chunk of a plan may stop short of its prompt's end.
        assert all(c.final for c in plan.prefill[:-1])
        if len(plan.prefill) < len(queue) or (plan.prefill and not plan.prefill[-1].final):
            assert plan_tokens(plan) == sched.config.token_budget

    def check_state(self) -> None:
        sched, cfg = self.sched, self.sched.config
        lists = {
            SeqState.WAITING: list(sched.waiting),
            SeqState.PREFILLING: sched.prefilling,
            SeqState.DECODING: sched.decoding,
        }
        held = [s.id for seqs in lists.values() for s in seqs]
        assert len(held) == len(set(held)) and set(held) == self.alive
        for state, seqs in lists.items():
            assert all(s.state is state for s in seqs)
        assert len(sched.prefilling) <= cfg.max_prefilling and sched.num_active <= cfg.max_running
        assert len(sched.waiting) <= self.max_waiting
        reserved = sum(s.kv_tokens for s in sched.prefilling + sched.decoding)
        assert sched.kv_reserved == reserved
        assert cfg.kv_capacity_tokens is None or reserved <= cfg.kv_capacity_tokens
        assert sched.has_work == bool(self.alive or self.owed_release)


def random_traffic(seed: int) -> Traffic:
    rng = random.Random(seed)
    max_running = rng.randint(1, 6)
    config = SchedulerConfig(
        max_running=max_running,
        max_prefilling=rng.randint(1, 4),
        token_budget=rng.randint(max_running, 24),
        kv_capacity_tokens=rng.choice([None, rng.randint(20, 120)]),
    )
    cached: dict[str, int] = {}
    uses_cache = rng.random() < 0.5
    sched = Scheduler(config, frozenset({EOS}), (lambda r: cached[r.id]) if uses_cache else None)
    runner = FakeRunner(sched, lambda _s, _k: EOS if rng.random() < 0.05 else rng.randint(1, 99))
    return Traffic(sched, runner, rng, cached=cached, uses_cache=uses_cache, max_waiting=rng.randint(1, 8))


@pytest.mark.parametrize("seed", range(60))
def test_scheduler_invariants_hold_under_random_traffic(seed: int) -> None:
    traffic = random_traffic(seed)
    for _ in range(150):
        for _ in range(traffic.rng.choice([0, 0, 0, 1, 1, 2, 4])):
            traffic.arrive()
        traffic.interfere()
        traffic.step()
    assert traffic.admitted, "the traffic never got anyone admitted"
    for _ in range(2000):  # no arrivals: everyone left must finish, nobody stuck waiting
        if not traffic.sched.has_work:
            break
        traffic.step()
    assert not traffic.sched.has_work and not traffic.alive
    assert set(traffic.ended) == set(traffic.added)
    assert traffic.released == set(traffic.admitted) == set(traffic.runner.released)
    assert traffic.sched.kv_reserved == 0 and not traffic.runner.computed
