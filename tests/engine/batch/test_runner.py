"""Tier 3, engine level: the batch lane against mlx-lm's own generation on the real model.

Greedy output of every row, in a batch with staggered joins and leaves and with prompts
prefilled in several chunks, must equal mlx_lm's single-request greedy output token for token
(float32 weights on the CPU give identical numerics at any batch size here; no fallback to
BatchGenerator parity was needed).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

import mlx_serve.engine.batch.runner as runner_module
from mlx_serve.engine.batch.prefix_cache import PrefixCache
from mlx_serve.engine.batch.runner import BatchRunner
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.rows import prefill
from mlx_serve.engine.types import Request, SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Name three colors.",
    "Write a haiku about rain.",
    "What is 2+2?",
    "Tell me a fact about cats.",
    "Say hello in Spanish.",
]


@pytest.fixture(scope="module")
def smollm(smollm_path: Path) -> tuple[Any, Any]:
    from mlx_lm import load

    from mlx_serve.engine.model.loader import maybe_dequantize

    model, tokenizer = load(str(smollm_path))
    return maybe_dequantize(model), tokenizer  # as the server runs it (float32 on a CPU)


def prompt_ids(tokenizer: Any, question: str) -> tuple[int, ...]:
    return tuple(
        tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    )


def reference(model: Any, prompt: tuple[int, ...], n: int, eos: set[int]) -> list[int]:
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=n):
        out.append(token)
        if token in eos:
            break
    return out


def drive(
    runner: BatchRunner,
    sched: Scheduler,
    arrivals: dict[int, list[Request]],
    prefix: PrefixCache | None = None,
) -> dict[str, list[int]]:
    """Run scheduler + runner until every arrival has finished; returns tokens per request."""
    out: dict[str, list[int]] = {}
    step = 0
    while step <= max(arrivals) or sched.has_work:
        for r in arrivals.get(step, []):
            sched.add(r)
            out[r.id] = []
        plan = sched.schedule()
        for sid in plan.admitted:
            seq = sched.get(sid)
            assert seq is not None
            cache = prefix.lookup(seq.request.prompt_tokens)[0] if seq.num_cached else None
            runner.admit(seq.request, cache, seq.num_cached)
        for u in sched.update(plan, runner.step(plan)):
            out[u.seq_id].append(u.token)
        step += 1
    return out


def test_runner_batch_with_joins_and_leaves_matches_mlx_lm_greedy(smollm: tuple[Any, Any]) -> None:
    model, tokenizer = smollm
    eos = set(tokenizer.eos_token_ids)
    lengths = [24, 6, 30, 12, 18, 9]
    requests = [
        Request(f"r{i}", prompt_ids(tokenizer, q), SamplingParams(), n)
        for i, (q, n) in enumerate(zip(QUESTIONS, lengths))
    ]
    # Budget 16 splits every prompt (~35 tokens) into chunks and lets rows join mid-decode.
    sched = Scheduler(SchedulerConfig(max_running=4, max_prefilling=2, token_budget=16), frozenset(eos))
    runner = BatchRunner(model, prefill_step_size=16)
    got = drive(runner, sched, {0: requests[:3], 2: requests[3:4], 7: requests[4:]})
    for r in requests:
        assert got[r.id] == reference(model, r.prompt_tokens, r.max_tokens, eos), r.id


def test_runner_rows_joining_at_a_padded_width_keep_mlx_lm_greedy(
    smollm: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With bucket_prefill (what a CUDA GPU gets: mlx_serve.engine.host.assemble.builds_per_shape), rows that join
    together are prefilled unevaluated at a width on mlx_serve.engine.rows.prefill.prefill_width's ladder,
    longer than their longest prompt; the padding is rolled out of their caches, and every
    row's greedy tokens still equal mlx-lm's, while the rows already decoding carry on."""
    model, tokenizer = smollm
    eos = set(tokenizer.eos_token_ids)
    requests = [
        Request(f"r{i}", prompt_ids(tokenizer, q), SamplingParams(), 10) for i, q in enumerate(QUESTIONS)
    ]
    widths: list[tuple[list[int], int]] = []
    lazily = prefill.prompt_lazily

    def watched(batch: Any, tokens: list[list[int]], width: int = 0) -> None:
        widths.append(([len(t) for t in tokens], width))
        lazily(batch, tokens, width)

    monkeypatch.setattr(runner_module, "prompt_lazily", watched)
    sched = Scheduler(SchedulerConfig(max_running=6, max_prefilling=3), frozenset(eos))
    runner = BatchRunner(model, bucket_prefill=True)
    got = drive(runner, sched, {0: requests[:3], 4: requests[3:]})
    for r in requests:
        assert got[r.id] == reference(model, r.prompt_tokens, r.max_tokens, eos), r.id
    assert len(widths) == 2  # three rows joined at once, twice
    for lengths, width in widths:
        assert width == prefill.prefill_width(max(lengths)) > max(lengths), widths


def test_runner_a_row_joining_alone_at_a_padded_width_keeps_mlx_lm_greedy_with_a_cached_prefix(
    smollm: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row that joins alone (an agent's next turn) is prefilled at its ladder width too; its
    padding is trimmed off its caches' end, where rows padded unlike each other are rolled.
    Greedy tokens equal mlx-lm's for a row from scratch and for one that starts from the first
    row's cached prefix, joining while another row decodes and joining an empty batch."""
    model, tokenizer = smollm
    eos = set(tokenizer.eos_token_ids)
    first = Request("first", prompt_ids(tokenizer, QUESTIONS[4]), SamplingParams(), 12)
    more = tokenizer.encode(" Answer in one short sentence; name the city first, then stop.")
    turn = Request("turn", (*first.prompt_tokens, *more), SamplingParams(), 12)
    other = Request("other", prompt_ids(tokenizer, QUESTIONS[1]), SamplingParams(), 30)
    widths: list[tuple[list[int], int]] = []
    lazily = prefill.prompt_lazily

    def watched(batch: Any, tokens: list[list[int]], width: int = 0) -> None:
        widths.append(([len(t) for t in tokens], width))
        lazily(batch, tokens, width)

    monkeypatch.setattr(runner_module, "prompt_lazily", watched)
    import mlx_lm.models.cache as mlx_cache

    rolls: list[int] = []
    roll = mlx_cache.dynamic_roll

    def counted(x: mx.array, shifts: mx.array, axis: int) -> mx.array:
        rolls.append(int(x.shape[axis]))
        return roll(x, shifts, axis)

    monkeypatch.setattr(mlx_cache, "dynamic_roll", counted)
    prefix = PrefixCache(max_entries=4, max_bytes=1 << 30)
    runner = BatchRunner(model, prefix_cache=prefix, bucket_prefill=True)
    sched = Scheduler(SchedulerConfig(), frozenset(eos), lambda r: prefix.lookup(r.prompt_tokens)[1])
    got = drive(runner, sched, {0: [first], 30: [other], 32: [turn]}, prefix)
    for r in (first, other, turn):
        assert got[r.id] == reference(model, r.prompt_tokens, r.max_tokens, eos), r.id
    alone = [(lengths, width) for lengths, width in widths if len(lengths) == 1]
    assert len(alone) == 3 and all(width > lengths[0] for lengths, width in alone), widths
    assert alone[-1][0][0] < len(turn.prompt_tokens) // 2  # the turn prefilled only its new tokens
    assert rolls == []  # no gather over a joining row's whole KV


def test_runner_a_lone_row_steps_on_plain_caches_and_rows_joining_it_keep_mlx_lm_greedy(
    smollm: tuple[Any, Any],
) -> None:
    """A row alone steps on plain KV caches (mlx-lm's single-stream path); a row joining it turns
    them back into batch caches, and when one of two leaves the other goes plain again. Every
    row's greedy tokens equal mlx-lm's through all of it, and the prefix cache gets what the
    lone row computed when it leaves."""
    model, tokenizer = smollm
    eos = set(tokenizer.eos_token_ids)
    a = Request("a", prompt_ids(tokenizer, QUESTIONS[4]), SamplingParams(), 28)
    b = Request("b", prompt_ids(tokenizer, QUESTIONS[3]), SamplingParams(), 6)
    prefix = PrefixCache(max_entries=4, max_bytes=1 << 30)
    runner = BatchRunner(model, prefix_cache=prefix)
    sched = Scheduler(SchedulerConfig(), frozenset(eos))
    seen: list[tuple[int, bool]] = []
    step = runner.step

    def watched(plan: Any) -> Any:
        out = step(plan)
        seen.append((runner.num_rows, runner._gen.plain))
        return out

    runner.step = watched  # type: ignore[method-assign]
    got = drive(runner, sched, {0: [a], 8: [b]}, prefix)
    assert got["a"] == reference(model, a.prompt_tokens, a.max_tokens, eos)
    assert got["b"] == reference(model, b.prompt_tokens, b.max_tokens, eos)
    alone = [plain for rows, plain in seen if rows == 1]
    assert all(plain for rows, plain in seen[1:] if rows == 1), seen  # after its first step
    assert not any(plain for rows, plain in seen if rows == 2), seen
    lone_again = [i for i, (rows, _) in enumerate(seen) if rows == 1 and i > 0 and seen[i - 1][0] == 2]
    assert alone and lone_again, seen
    assert prefix.lookup((*a.prompt_tokens, *got["a"]))[1] >= len(a.prompt_tokens)


def test_runner_seeded_sampling_same_alone_or_batched(smollm: tuple[Any, Any]) -> None:
    model, tokenizer = smollm
    eos = frozenset(tokenizer.eos_token_ids)
    seeded = Request("s", prompt_ids(tokenizer, QUESTIONS[2]), SamplingParams(temperature=1.0, seed=42), 20)

    def run(with_others: bool) -> list[int]:
        sched = Scheduler(SchedulerConfig(), eos)
        others = (
            [
                Request(f"o{i}", prompt_ids(tokenizer, q), SamplingParams(temperature=0.8), 20)
                for i, q in enumerate(QUESTIONS[:3])
            ]
            if with_others
            else []
        )
        return drive(BatchRunner(model), sched, {0: [*others[:2], seeded], 1: others[2:]})["s"]

    alone = run(False)
    assert alone == run(False)
    assert alone == run(True)


def test_runner_prefix_cache_second_turn_skips_prefill_and_keeps_output(smollm: tuple[Any, Any]) -> None:
    model, tokenizer = smollm
    eos = frozenset(tokenizer.eos_token_ids)
    prefix = PrefixCache(max_entries=4, max_bytes=1 << 30)
    runner = BatchRunner(model, prefix_cache=prefix)
    first = Request("a", prompt_ids(tokenizer, QUESTIONS[2]), SamplingParams(), 12)
    sched = Scheduler(SchedulerConfig(), eos)
    got = drive(runner, sched, {0: [first]}, prefix)["a"]
    follow = (*first.prompt_tokens, *got, *tokenizer.encode("\nMore please.", add_special_tokens=False))
    second = Request("b", follow, SamplingParams(), 12)
    sched.cached_prefix = lambda r: prefix.lookup(r.prompt_tokens)[1]
    out = drive(runner, sched, {0: [second]}, prefix)["b"]
    assert prefix.stats.hits >= 1 and prefix.stats.cached_tokens >= len(first.prompt_tokens)
    assert out == reference(model, follow, 12, set(eos))


def test_runner_a_row_that_leaves_mid_prefill_leaves_its_chunks_for_the_same_prompt_again(
    smollm: tuple[Any, Any],
) -> None:
    # Codex gives up on a request after 5 minutes without an event and sends it again: on a slow
    # machine a long prompt's prefill then started over each time, forever.
    model, tokenizer = smollm
    eos = frozenset(tokenizer.eos_token_ids)
    prefix = PrefixCache(max_entries=4, max_bytes=1 << 30)
    runner = BatchRunner(model, prefill_step_size=16, prefix_cache=prefix)
    prompt = prompt_ids(tokenizer, " ".join(QUESTIONS))
    assert len(prompt) > 64
    sched = Scheduler(SchedulerConfig(max_running=4, token_budget=16), eos)
    sched.add(Request("gone", prompt, SamplingParams(), 8))
    for _ in range(3):  # three 16-token chunks of its prompt, then its client leaves
        plan = sched.schedule()
        for sid in plan.admitted:
            runner.admit(sched.get(sid).request)  # type: ignore[union-attr]
        assert not sched.update(plan, runner.step(plan))
    sched.abort("gone")
    runner.step(sched.schedule())  # the release
    assert prefix.lookup(prompt)[1] == 48  # its three chunks are there for the next try
    again = Request("again", prompt, SamplingParams(), 8)
    sched.cached_prefix = lambda r: prefix.lookup(r.prompt_tokens)[1]
    out = drive(runner, sched, {0: [again]}, prefix)["again"]
    assert prefix.stats.cached_tokens == 48 * prefix.stats.hits  # and the next try resumed from them
    assert out == reference(model, prompt, 8, set(eos))


def test_the_warm_up_runs_its_ready_part_then_idle_bursts_and_leaves_output_mlx_lm_greedy(
    smollm: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The GPU warm-up (mlx_serve.engine.host.warmup), forced on here: its throwaway requests run through a runner
    # of their own, so what the serving runner answers before and after each part is unchanged.
    import mlx_serve.engine.host.warmup

    monkeypatch.setattr(
        mlx_serve.engine.host.warmup, "READY_ROWS", 2
    )  # bursts of 1 and 2 rows now, 4 while idle
    model, tokenizer = smollm
    eos = set(tokenizer.eos_token_ids)
    config = SchedulerConfig(max_running=4, token_budget=128)
    first, second = (
        Request(f"q{i}", prompt_ids(tokenizer, q), SamplingParams(), 12) for i, q in enumerate(QUESTIONS[:2])
    )
    idle_work = mlx_serve.engine.host.warmup.warm_up(model, config, len(tokenizer.vocab), gpu_only=False)
    assert idle_work is not None
    sched, runner = Scheduler(config, frozenset(eos)), BatchRunner(model, prefill_step_size=128)
    assert drive(runner, sched, {0: [first]})["q0"] == reference(model, first.prompt_tokens, 12, eos)
    assert (
        idle_work.step() and idle_work.step()
    )  # the 4-row burst, a batch step at a time: its prefill, a token
    idle_work.pause()  # a request arrives: the burst under way is dropped
    assert drive(runner, sched, {0: [second]})["q1"] == reference(model, second.prompt_tokens, 12, eos)
    steps = 1
    while idle_work.step():  # the burst again, from its start, to the end
        steps += 1
    assert idle_work.restarts == 1 and steps >= 3 and not idle_work.step()
    assert drive(runner, sched, {0: [first]})["q0"] == reference(model, first.prompt_tokens, 12, eos)
    assert (
        mlx_serve.engine.host.warmup.warm_up(model, replace(config, max_running=2), 100, gpu_only=False)
        is None
    )  # nothing left


def test_prefill_width_pads_at_most_a_quarter_onto_a_few_dozen_widths() -> None:
    widths = {prefill.prefill_width(n) for n in range(1, 2049)}
    assert len(widths) == 33 and max(widths) == 2048
    for n in range(17, 4097):
        w = prefill.prefill_width(n)
        assert n <= w <= n * 1.25, n
    assert [prefill.prefill_width(n) for n in (1, 3, 9, 16, 17, 90)] == [1, 4, 16, 16, 20, 96]
