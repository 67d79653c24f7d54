"""Speculative decoding inside the batch: drafters and the greedy oracle (KV cuts: test_cut_cache).

The runs here turn the timing-based gate off (`gated=False`) so every drafting row speculates
every step, deterministically; the gate itself is tested on its own (test_gate.py).

Tier 3 parts run SmolLM2 in float32 (as the server runs it on a CPU): greedy output with
speculation — n-gram, a prediction, a draft model that always agrees (the model itself) and one
that never does (a random tiny model with the same tokenizer) — must equal mlx-lm's plain
greedy output token for token, alone and in a batch with joins and leaves.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm import load

from mlx_serve.engine.batch.runner import BatchRunner
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.rows.step_records import StepOutput
from mlx_serve.engine.speculation.drafting import (
    PREDICTION_K,
    NgramIndex,
    PredictionLookup,
    PromptLookup,
    RowSpeculation,
)
from mlx_serve.engine.speculation.rows import Speculation
from mlx_serve.engine.types import Request, SamplingParams
from tests.engine.batch.test_runner import drive, prompt_ids, reference

COPY_PROMPTS = [
    "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the river bank.",
    "What is the capital of France?",
    "Copy this list: apples, oranges, pears, plums, grapes, cherries.",
    "Write a haiku about rain.",
]


# --- drafters (pure Python) -----------------------------------------------------------------


def test_ngram_index_finds_the_latest_earlier_occurrence_never_the_tail_itself() -> None:
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]
    assert NgramIndex().lookup(seq, 2) == [7, 1]  # the latest earlier "1 2 3" was followed by 7
    assert NgramIndex().lookup([5, 6, 7], 3) == []
    assert NgramIndex(min_n=2).lookup([4, 1, 5, 1], 2) == []  # a 1-gram match is below min_n


def test_prompt_lookup_guesses_the_pending_token_when_it_is_not_known_yet() -> None:
    history = [10, 11, 12, 13, 14, 99, 10, 11]
    lazy = PromptLookup().draft(history, None, 2)
    assert (lazy.guess, lazy.tokens) == (12, [13, 14])
    known = PromptLookup().draft(history, 12, 2)
    assert (known.guess, known.tokens) == (None, [13, 14])


def test_prediction_lookup_follows_the_prediction_and_resyncs_after_an_edit() -> None:
    pred = (20, 21, 22, 23, 24, 25, 26)
    d = PredictionLookup(pred, prompt_len=2)
    first = d.draft([1, 2], None, 3)  # nothing generated yet: the prediction's opening
    assert (first.guess, first.tokens) == (20, [21, 22, 23])
    assert d.draft([1, 2, 20, 21], 22, 3).tokens == [23, 24, 25]
    # the output replaced 23 by 77 and went on with 24: find 24 in the prediction again
    assert d.draft([1, 2, 20, 21, 22, 77], 24, 2).tokens == [25, 26]


def test_a_repetitive_prediction_drafts_from_where_the_output_is_not_from_its_end() -> None:
    pred = (7, 7, 7, 7, 7, 7, 7, 7, 9, 9)
    d = PredictionLookup(pred, prompt_len=2)
    # first call after 3 tokens were output (the cursor is not set): the tail 7 7 7 last occurs
    # at the prediction's 8th token, but the output has followed the prediction from its start
    assert d.draft([1, 2, 7, 7, 7], None, 3).tokens == [7, 7, 7]
    assert d.draft([1, 2, 7, 7, 7, 7, 7, 7], 7, 3).tokens == [7, 9, 9]  # 7 of 8 sevens out


def test_a_row_whose_drafts_keep_failing_pauses_then_tries_again() -> None:
    row = RowSpeculation(PromptLookup(), k=2)
    for _ in range(4):
        assert row.active
        row.record(2, 0)
    paused = 0
    while not row.active:
        paused += 1
    assert paused == 8  # then it speculates again
    good = RowSpeculation(PromptLookup(), k=2)
    for _ in range(8):
        good.record(2, 2)
        assert good.active


# --- the greedy oracle on the real model -----------------------------------------------------


@pytest.fixture(scope="module")
def smollm(smollm_path: Path) -> tuple[Any, Any]:
    from mlx_serve.engine.model.loader import maybe_dequantize

    model, tokenizer = load(str(smollm_path))
    return maybe_dequantize(model), tokenizer


@pytest.fixture(scope="module")
def requests_and_reference(smollm: tuple[Any, Any]) -> tuple[list[Request], dict[str, list[int]]]:
    model, tokenizer = smollm
    eos = set(tokenizer.eos_token_ids)
    reqs = [
        Request(f"r{i}", prompt_ids(tokenizer, q), SamplingParams(), n)
        for i, (q, n) in enumerate(zip(COPY_PROMPTS, (28, 10, 24, 20)))
    ]
    return reqs, {r.id: reference(model, r.prompt_tokens, r.max_tokens, eos) for r in reqs}


class Recording(BatchRunner):
    """A runner that sums what each row drafted and had accepted."""

    def step(self, plan: Any) -> StepOutput:
        out = super().step(plan)
        for seq_id, (d, a) in out.speculation.items():
            seen = self.seen.setdefault(seq_id, [0, 0])
            seen[0], seen[1] = seen[0] + d, seen[1] + a
        return out

    seen: dict[str, list[int]]


def run_batch(
    model: Any,
    tokenizer: Any,
    requests: list[Request],
    spec: Speculation,
    arrivals: tuple[int, ...] = (0, 0, 3, 9),
) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    sched = Scheduler(
        SchedulerConfig(max_running=4, max_prefilling=2, token_budget=64, draft_tokens=spec.num_draft_tokens),
        frozenset(tokenizer.eos_token_ids),
    )
    runner = Recording(model, prefill_step_size=64, speculation=spec)
    runner.seen = {}
    plan: dict[int, list[Request]] = {}
    for step, r in zip(arrivals, requests):
        plan.setdefault(step, []).append(r)
    return drive(runner, sched, plan), runner.seen


@pytest.mark.parametrize("draft", ["ngram", "self", "tiny"])
def test_speculative_greedy_in_a_batch_with_joins_and_leaves_equals_plain_greedy(
    smollm: tuple[Any, Any],
    requests_and_reference: tuple[list[Request], dict[str, list[int]]],
    tiny_path: Path,
    draft: str,
) -> None:
    model, tokenizer = smollm
    reqs, ref = requests_and_reference
    if draft == "ngram":
        spec = Speculation("ngram", 3, gated=False)
    else:  # the model itself always agrees; a random model with the same tokenizer never does
        spec = Speculation("draft", 3, model if draft == "self" else load(str(tiny_path))[0], gated=False)
    got, seen = run_batch(model, tokenizer, reqs, spec)
    for r in reqs:
        assert got[r.id] == ref[r.id], r.id
    drafted, accepted = sum(d for d, _ in seen.values()), sum(a for _, a in seen.values())
    assert drafted > 0
    if draft == "self":
        assert accepted == drafted
    if draft == "tiny":
        assert accepted < drafted / 4
    if draft == "ngram":  # the copy prompts repeat their own text
        assert seen["r0"][1] > 0 and seen["r2"][1] > 0


def test_a_prediction_speeds_a_request_and_a_wrong_one_changes_nothing(
    smollm: tuple[Any, Any], requests_and_reference: tuple[list[Request], dict[str, list[int]]]
) -> None:
    model, tokenizer = smollm
    reqs, ref = requests_and_reference
    right = tuple(ref["r0"][:-1])  # the exact answer, as a client editing known text would send
    wrong = tuple(
        tokenizer.encode("Bananas are yellow and grow in bunches on tall plants.", add_special_tokens=False)
    )
    asked = [
        Request("r0", reqs[0].prompt_tokens, SamplingParams(), reqs[0].max_tokens, prediction=right),
        Request("r1", reqs[1].prompt_tokens, SamplingParams(), reqs[1].max_tokens, prediction=wrong),
        reqs[2],
        reqs[3],
    ]
    got, seen = run_batch(model, tokenizer, asked, Speculation(None, 4, gated=False))
    for r in asked:
        assert got[r.id] == ref[r.id], r.id
    assert seen["r0"][1] >= len(right) - 4  # nearly every predicted token was accepted
    assert seen["r1"][1] <= 1
    assert "r2" not in seen and "r3" not in seen  # no server drafter: only predictions speculate


def test_num_draft_tokens_zero_turns_a_rows_speculation_off(
    smollm: tuple[Any, Any], requests_and_reference: tuple[list[Request], dict[str, list[int]]]
) -> None:
    model, tokenizer = smollm
    reqs, ref = requests_and_reference
    off = Request("r0", reqs[0].prompt_tokens, SamplingParams(), reqs[0].max_tokens, num_draft_tokens=0)
    got, seen = run_batch(
        model, tokenizer, [off, reqs[2]], Speculation("ngram", 3, gated=False), arrivals=(0, 0)
    )
    assert got["r0"] == ref["r0"] and got["r2"] == ref["r2"]
    assert "r0" not in seen and seen["r2"][0] > 0


def test_seeded_sampling_is_the_same_text_with_or_without_speculation(smollm: tuple[Any, Any]) -> None:
    """Each position is sampled from the target's distribution with the row's own key sequence,
    so accepting a draft (it equals that sample) changes nothing about the text."""
    model, tokenizer = smollm
    prompt = prompt_ids(tokenizer, COPY_PROMPTS[2])
    seeded = [
        Request(f"s{i}", prompt, SamplingParams(temperature=0.7, top_p=0.95, seed=i), 24) for i in range(3)
    ]
    plain, _ = run_batch(model, tokenizer, seeded, Speculation(None), arrivals=(0, 0, 2))
    spec, seen = run_batch(model, tokenizer, seeded, Speculation("ngram", 3, gated=False), arrivals=(0, 0, 2))
    assert plain == spec
    assert sum(a for _, a in seen.values()) > 0


def test_rows_the_draft_does_not_follow_ride_along_and_the_rest_draft_exactly(tiny_path: Path) -> None:
    from mlx_lm.generate import generate_step

    from mlx_serve.engine.speculation.draft_model import DraftRows

    draft = load(str(tiny_path))[0]
    prompts = [list(range(100, 130)), list(range(200, 240)), list(range(300, 310))]
    rows = DraftRows(draft, prefill_step_size=64)
    rows.prefill(prompts, [True, False, True])
    assert rows.live == [True, False, True]
    assert rows.caches[0].offset.tolist()[1] == 1  # a placeholder: no prefill of its 40 tokens
    histories = [prompts[0] + [5, 6], prompts[1] + list(range(400, 430)), prompts[2] + [7]]
    got = rows.draft(histories, mx.array([55, 66, 77]), 3).tolist()
    for i in (0, 2):
        h, y = histories[i], (55, 66, 77)[i]
        assert got[i] == [t for t, _ in generate_step(mx.array(h + [y]), draft, max_tokens=3)]
    rows.filter([1, 2])
    assert rows.live == [False, True]


def test_a_self_draft_runs_gated_plain_and_its_outputs_stay_greedy(
    smollm: tuple[Any, Any], requests_and_reference: tuple[list[Request], dict[str, list[int]]]
) -> None:
    """The model as its own draft costs as much as it saves at best: the gate starts plain and
    the draft model follows one joining row in four, so at most one row ever drafts here."""
    model, tokenizer = smollm
    reqs, ref = requests_and_reference
    got, seen = run_batch(model, tokenizer, reqs, Speculation("draft", 3, model))
    for r in reqs:
        assert got[r.id] == ref[r.id], r.id
    assert sum(1 for d, _ in seen.values() if d > 0) <= 1


def test_a_lagging_draft_cache_catches_up_and_drafts_what_the_draft_model_would(tiny_path: Path) -> None:
    """Rows whose draft cache fell behind by different amounts (plain steps do not feed the
    draft) catch up in pieces and draft exactly the draft model's own greedy continuation."""
    from mlx_lm.generate import generate_step

    from mlx_serve.engine.speculation.draft_model import DraftRows

    draft = load(str(tiny_path))[0]
    prompts = [list(range(100, 130)), list(range(200, 212))]
    rows = DraftRows(draft, prefill_step_size=64)
    rows.prefill(prompts)
    histories = [prompts[0] + list(range(300, 341)), prompts[1] + [7, 8, 9]]  # lags of 41 and 3
    pending = mx.array([55, 66])
    got = rows.draft(histories, pending, 3).tolist()
    for h, y, out in zip(histories, (55, 66), got):
        want = [t for t, _ in generate_step(mx.array(h + [y]), draft, max_tokens=3)]
        assert out == want
    assert rows.seen == [len(h) + 1 for h in histories]


# --- Predicted Outputs after edits: the drafter finds its place again -------------------------


def verify_against(pred: list[int], out: list[int], adaptive: bool = True) -> tuple[int, int, int]:
    """Decode `out` as the verify step does, drafting from `pred` as the runner does (the row's
    draft length, which follows what it accepted; or always PREDICTION_K): each step emits its
    pending token plus the drafts that equal what follows it. (accepted drafts, steps, drafted)."""
    drafter, prompt = PredictionLookup(tuple(pred), prompt_len=4), [900, 901, 902, 903]
    row = RowSpeculation(drafter, PREDICTION_K, prediction=True)
    i = accepted = steps = drafted = 0
    while i < len(out):
        draft = drafter.draft(prompt + out[:i], out[i], row.draft_len if adaptive else PREDICTION_K).tokens
        n = next((j for j, (t, want) in enumerate(zip(draft, out[i + 1 :])) if t != want),
                 min(len(draft), len(out) - i - 1))  # fmt: skip
        row.record(len(draft), n)
        accepted, steps, drafted, i = accepted + n, steps + 1, drafted + len(draft), i + 1 + n
    return accepted, steps, drafted


def edit(base: list[int], every: int, kind: str) -> tuple[list[int], int]:
    """`base` with every `every`-th token edited; the output and how many tokens it kept."""
    out: list[int] = []
    for j, t in enumerate(base):
        if j % every != every - 1:
            out.append(t)
        elif kind == "changed":
            out.append(5000 + j)
        elif kind == "inserted":
            out += [t, 6000 + j]
        elif kind == "word":  # one token becomes two others
            out += [7000 + j, 8000 + j]
    return out, sum(1 for j in range(len(base)) if j % every != every - 1) + (
        len(base) // every if kind == "inserted" else 0
    )


CODE = [random.Random(7).randrange(60) for _ in range(400)]  # a small vocabulary repeats, like code


def test_an_exact_prediction_drafts_its_own_length_not_the_servers_gamma() -> None:
    accepted, steps, _ = verify_against(CODE, CODE)
    assert accepted == len(CODE) - steps and steps <= len(CODE) // (PREDICTION_K + 1) + 1


@pytest.mark.parametrize("kind", ["changed", "deleted", "inserted", "word"])
@pytest.mark.parametrize("every", [8, 10])
def test_after_each_edit_the_prediction_drafter_finds_its_place_again(kind: str, every: int) -> None:
    out, unchanged = edit(CODE, every, kind)
    accepted, _, _ = verify_against(CODE, out)
    assert accepted >= 0.8 * unchanged, (accepted, unchanged)


@pytest.mark.parametrize("kind", ["changed", "deleted", "inserted", "word"])
def test_after_edits_a_prediction_verifies_about_as_wide_as_its_unchanged_runs(kind: str) -> None:
    # Every 8th token edited: runs of ~7 match. Verifying 16 drafts a step would pay for ~9
    # positions that cannot be accepted; the row's draft length follows its runs instead, for
    # (nearly) the same accepted tokens and steps.
    out, _ = edit(CODE, 8, kind)
    fixed, adaptive = verify_against(CODE, out, adaptive=False), verify_against(CODE, out)
    # drafted (verified) positions; deleted tokens waste none either way (the drafts skip them)
    assert adaptive[2] <= (1.0 if kind == "deleted" else 0.7) * fixed[2], (adaptive, fixed)
    assert adaptive[0] >= 0.95 * fixed[0] and adaptive[1] <= 1.1 * fixed[1], (adaptive, fixed)


def test_a_prediction_row_grows_its_draft_back_while_drafts_are_accepted_whole() -> None:
    row = RowSpeculation(None, PREDICTION_K, prediction=True)
    assert row.draft_len == PREDICTION_K  # a prediction starts out trusted
    row.record(16, 3)
    assert row.draft_len == 5  # the run it matched, plus two
    row.record(5, 1)
    assert row.draft_len == 5  # one shorter run (a step that began late in a stretch): kept
    for _ in range(3):
        row.record(5, 0)
    assert row.draft_len == 4  # its last four rejections matched little: never below PREDICTION_MIN_K
    row.record(4, 4)
    row.record(8, 8)
    assert row.draft_len == PREDICTION_K  # doubled back, up to k
    plain = RowSpeculation(PromptLookup(), k=3)
    plain.record(3, 0)
    assert plain.draft_len == 3  # the server's γ rows keep theirs (they pause instead)


def test_the_gate_is_charged_for_the_kind_of_step_that_ran_and_not_for_a_joins_draft_prefill(
    smollm: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two ways the gate used to learn that a winning draft model loses (Qwen2.5-Coder 0.5B for
    # the 1.5B, one stream on a CPU: gated 1.00x where the gate off ran 1.5x): the whole draft
    # prefill of a joining prompt charged to one step's rate, and steps it allowed in which no
    # row had drafts (rows the draft was not following) charged to speculation at plain speed.
    import mlx_serve.engine.speculation.rows

    model, tokenizer = smollm
    eos = set(tokenizer.eos_token_ids)
    clock = {"skew": 0.0}
    real = mlx_serve.engine.speculation.rows.time.perf_counter

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            return real() + clock["skew"]

    monkeypatch.setattr(mlx_serve.engine.speculation.rows, "time", Clock)
    recorded: list[tuple[bool, float]] = []

    def runner_with(mirror: bool) -> BatchRunner:
        runner = BatchRunner(model, speculation=Speculation("draft", 3, model))
        gate, draft_rows = runner.spec.gate, runner.spec.draft_rows
        assert draft_rows is not None
        prefill = draft_rows.prefill

        def slow_prefill(prompts: list[list[int]], mirrored: list[bool] | None = None) -> None:
            prefill(prompts, mirrored)
            clock["skew"] += 100.0  # as if the draft's prefill of this prompt took 100 s

        monkeypatch.setattr(draft_rows, "prefill", slow_prefill)
        monkeypatch.setattr(gate, "mirror", lambda rows: mirror)
        monkeypatch.setattr(gate, "choose", lambda rows: True)  # every step may speculate
        monkeypatch.setattr(gate, "record", lambda rows, spec, tokens, s: recorded.append((spec, s)))
        return runner

    for mirror in (False, True):
        recorded.clear()
        request = Request("a", prompt_ids(tokenizer, COPY_PROMPTS[0]), SamplingParams(), 24)
        sched = Scheduler(SchedulerConfig(max_running=4), frozenset(eos))
        got = drive(runner_with(mirror), sched, {0: [request]})["a"]
        assert got == reference(model, request.prompt_tokens, 24, eos)
        assert recorded and all(s < 50.0 for _, s in recorded)  # no step paid for the prefill
        # not followed by the draft, every step ran plain and counts as plain; followed, speculative
        assert {spec for spec, _ in recorded} == ({True} if mirror else {False})
