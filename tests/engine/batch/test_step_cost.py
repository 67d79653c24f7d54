"""Tier 1: a step's prompt budget from measured step cost, and prompts prefilling side by side."""

from __future__ import annotations

from mlx_serve.engine.batch.step_cost import DECODE_STEP_MULTIPLE, StepCost, fair_shares
from tests.engine.batch.test_scheduler import make, req, step


def test_fair_shares_split_evenly_over_the_oldest_rows() -> None:
    assert fair_shares([10_000, 10_000], 2048, 256) == [1024, 1024]
    assert fair_shares([100, 10_000, 10_000], 2048, 256) == [100, 974, 974]


def test_fair_shares_never_leave_budget_unused_while_a_prompt_waits() -> None:
    # only 2048 // 512 = 4 rows get an even share; what they leave goes on in order
    assert fair_shares([10, 10, 10, 10, 5000, 5000], 2048, 512) == [10, 10, 10, 10, 2008, 0]
    assert sum(fair_shares([3000, 5, 9000], 1000, 256)) == 1000


def test_fair_shares_give_a_budget_below_min_chunk_to_the_oldest() -> None:
    assert fair_shares([500, 500], 100, 256) == [100, 0]
    assert fair_shares([], 2048, 256) == []


def test_step_cost_keeps_a_step_beside_decoding_rows_within_its_multiple_of_a_decode_step() -> None:
    cost = StepCost(min_chunk=64)
    assert cost.prompt_budget(2048, decode_rows=8) == 2048  # nothing measured yet
    for _ in range(20):
        cost.observe(0, 8, 0.010)  # decode steps of 10 ms
        cost.observe(1000, 8, 0.010 + 1000 * 0.0001)  # 0.1 ms a prompt token
    budget = cost.prompt_budget(2048, decode_rows=8)
    step_s = 0.010 + budget * 0.0001
    assert abs(step_s - DECODE_STEP_MULTIPLE * 0.010) < 0.001, budget
    assert cost.prompt_budget(2048, decode_rows=0) == 2048  # no stream to protect: the whole budget


def test_step_cost_honours_an_operator_target_and_off_and_the_chunk_floor() -> None:
    cost = StepCost(max_step_s=0.050, min_chunk=64)
    cost.observe(0, 4, 0.010)
    cost.observe(500, 4, 0.010 + 500 * 0.0002)
    assert cost.prompt_budget(4096, 4) == 200  # (50 - 10) ms / 0.2 ms
    slow = StepCost(max_step_s=0.012, min_chunk=64)
    slow.observe(0, 4, 0.010)
    slow.observe(500, 4, 0.010 + 500 * 0.0002)
    assert slow.prompt_budget(4096, 4) == 64  # never below the floor: the prompt still moves
    off = StepCost(max_step_s=0, min_chunk=64)
    off.observe(0, 4, 0.010)
    off.observe(500, 4, 0.5)
    assert off.prompt_budget(4096, 4) == 4096


def test_scheduler_prefills_a_second_long_prompt_beside_the_first() -> None:
    sched, runner = make(token_budget=2048, max_prefilling=4)
    sched.add(req("first", prompt_len=12_000))
    sched.add(req("second", prompt_len=1_000))
    plan, _ = step(sched, runner)
    sizes = {c.seq_id: c.end - c.start for c in plan.prefill}
    assert sizes == {"first": 1048, "second": 1000}  # the short one is done in its first step
    assert [c.final for c in plan.prefill] == [False, True]


def test_scheduler_shrinks_prompt_chunks_to_the_measured_step_target_while_rows_decode() -> None:
    sched, runner = make(token_budget=2048, max_prefilling=4, max_step_s=0.030, min_chunk=64)
    sched.add(req("streaming", prompt_len=8))
    step(sched, runner)
    sched.cost.observe(0, 1, 0.010)
    sched.cost.observe(1000, 1, 0.010 + 1000 * 0.0001)
    sched.add(req("long", prompt_len=12_000))
    plan, _ = step(sched, runner)
    assert plan.decode == ("streaming",)
    assert [c.end - c.start for c in plan.prefill] == [200]  # (30 - 10) ms at 0.1 ms a token
