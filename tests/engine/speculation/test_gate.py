"""The speculation gate (engine.speculation.gate): which kind of step, plain or speculative, a
batch of a given size takes, from the rates it has measured, and how often it probes the other."""

from __future__ import annotations

from mlx_serve.engine.speculation.gate import SpeculationGate, breakeven_acceptance


def test_the_gate_picks_the_faster_kind_of_step_and_keeps_probing_the_other() -> None:
    gate = SpeculationGate(probe_every=10, probe_len=2)
    assert gate.choose(4) is True  # nothing known: try speculating first
    gate.record(4, True, tokens=90, seconds=1.0)
    assert gate.choose(5) is False  # 4 and 5 rows share a bucket; plain is unknown there
    gate.record(5, False, tokens=100, seconds=1.0)
    picks = [gate.choose(4) for _ in range(40)]
    # plain wins by a little; speculation is re-probed for 2 steps after 10, then after 20 more
    assert [i for i, p in enumerate(picks) if p] == [10, 11, 32, 33]
    dear = SpeculationGate(probe_every=10, probe_len=2)
    dear.record(4, True, tokens=25, seconds=1.0)
    dear.record(4, False, tokens=100, seconds=1.0)  # speculation runs at a quarter of plain here
    picks = [dear.choose(4) for _ in range(300)]
    # so probes come no more often than keeps their cost within 2% (2 x 0.75 / 0.02 = 75 steps)
    assert [i for i, p in enumerate(picks) if p] == [75, 76, 227, 228]
    gate.record(4, True, tokens=1000, seconds=1.0)  # acceptance went up: speculation now wins
    assert [gate.choose(4) for _ in range(10)] == [True] * 10
    assert gate.choose(16) is True  # a larger batch where nothing smaller lost: it explores
    slow = SpeculationGate(probe_every=10, probe_len=2)
    slow.record(2, True, tokens=10, seconds=1.0)
    slow.record(2, False, tokens=20, seconds=1.0)  # speculation lost at 2-3 rows
    assert slow.choose(8) is False  # so at 8 rows plain goes first,
    slow.record(8, False, tokens=80, seconds=1.0)
    assert [slow.choose(8) for _ in range(12)].count(True) == 2  # and speculation is only probed


def test_a_draft_model_too_big_to_pay_starts_plain_and_follows_only_a_few_joining_rows() -> None:
    assert breakeven_acceptance(0.9, 3) > 0.9  # nearly the target's size: needs ~94% acceptance
    assert breakeven_acceptance(1.0, 3) is None  # the model as its own draft can never pay
    assert breakeven_acceptance(0.1, 3) < 0.3
    gate = SpeculationGate(probe_every=10, probe_len=2, expect_loss=True)
    assert gate.choose(1) is False and gate.choose(16) is False  # plain first, at every size
    gate.record(1, False, tokens=10, seconds=1.0)
    assert [gate.choose(1) for _ in range(12)].count(True) == 2  # then speculation is only probed
    # joining rows get a draft cache one in 4, then one in 8, ...: probes have rows to draft for
    assert [i for i in range(30) if gate.mirror(4)] == [3, 11, 27]
    gate.record(4, True, tokens=90, seconds=1.0)
    gate.record(4, False, tokens=40, seconds=1.0)  # the probe found speculation winning at 4-7 rows
    assert all(gate.mirror(5) for _ in range(5)) and gate.choose(5) is True
    good = SpeculationGate()
    assert good.choose(8) is True and good.mirror(8) is True  # a cheap drafter explores at once
