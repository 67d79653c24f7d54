"""Tier 3, engine level: the prefix cache as make_core assembles it (memory-sized block store with
its disk tier) on the real model: a resend after an abort resumes, and greedy text with a cached
prefix, from memory and from disk after a restart, equals mlx-lm's without one."""

from __future__ import annotations

import queue
import threading
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from mlx_serve.engine.batch.block_store import BlockStore
from mlx_serve.engine.batch.core import Core
from mlx_serve.engine.batch.core_parts import Ticket
from mlx_serve.engine.host.assemble import make_core
from mlx_serve.engine.host.settings import EngineSettings
from mlx_serve.engine.model.loader import LoadedModel
from mlx_serve.engine.types import (
    Admitted,
    CacheMiss,
    Counters,
    Event,
    Finished,
    Request,
    SamplingParams,
    TextDelta,
)

STORY = (
    "You are a careful assistant for a team that maintains a large Python service. "
    "Answer briefly. Here are the team's notes: the service reads requests, checks them, "
    "queues them, runs them in batches and writes the answers back in order. "
)


@pytest.fixture(scope="module")
def smollm(smollm_path: Path) -> LoadedModel:
    from mlx_lm import load

    from mlx_serve.engine.model.loader import maybe_dequantize

    model, tokenizer = load(str(smollm_path))
    return LoadedModel(maybe_dequantize(model), tokenizer, "smollm2", smollm_path)


def core_for(loaded: LoadedModel, folder: Path, **settings: Any) -> Core:
    return make_core(
        loaded, Counters(), EngineSettings(warmup=False, prompt_cache_dir=str(folder), **settings)
    )


def chat(loaded: LoadedModel, turns: list[tuple[str, str]]) -> tuple[int, ...]:
    messages = [{"role": role, "content": text} for role, text in turns]
    return tuple(loaded.tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def reference(loaded: LoadedModel, prompt: tuple[int, ...], n: int) -> str:
    eos, out = set(loaded.tokenizer.eos_token_ids), []
    for token, _ in generate_step(mx.array(prompt), loaded.model, max_tokens=n):
        if token in eos:
            break
        out.append(token)
    return str(loaded.tokenizer.decode(out))


def serve(core: Core, request: Request) -> tuple[str, Finished]:
    """One request through the core's own loop, to its end."""
    inbox: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
    events: queue.Queue[Event | Any] = queue.Queue()
    inbox.put(Ticket(request, events.put))
    thread = threading.Thread(target=core.serve, args=(inbox,), daemon=True)
    thread.start()
    text = ""
    while not isinstance(ev := events.get(timeout=300), Finished):
        if isinstance(ev, Admitted):  # the server's note of what was cached, not a text event
            continue
        assert isinstance(ev, TextDelta), ev
        text += ev.text
    inbox.put(None)
    thread.join(60)
    return text, ev


def test_a_prompt_sent_again_right_after_its_abort_resumes_from_its_computed_chunks(
    smollm: LoadedModel, tmp_path: Path
) -> None:
    """Claude Code and Codex resend the same body at once after aborting a long prefill: the
    rows that left are released, their chunks stored, before the resend looks its prefix up."""
    core = core_for(smollm, tmp_path, token_budget=32)
    prompt = chat(smollm, [("system", STORY * 3), ("user", "What does the service do first?")])
    assert len(prompt) > 160
    first = Ticket(Request("first", prompt, SamplingParams(), 8), lambda _ev: None)
    core._accept_guarded(first)
    for _ in range(3):  # three 32-token chunks, then the client gives up
        core._step()
    first.aborted.set()
    got: list[Event | Any] = []
    again = Ticket(Request("again", prompt, SamplingParams(), 8), got.append)
    core._accept_guarded(again)  # it arrives with the abort, as a resend does
    core._reap_aborted()
    core._step()
    seq = core.scheduler.get("again")
    assert seq is not None and seq.num_cached == 96
    while core.scheduler.has_work:
        core._step()
    end = got[-1]
    assert isinstance(end, Finished) and end.usage.cached_tokens == 96
    text = "".join(e.text for e in got if isinstance(e, TextDelta))
    assert text == reference(smollm, prompt, 8)


def test_greedy_text_with_a_cached_prefix_from_memory_and_from_disk_equals_mlx_lm_without_one(
    smollm: LoadedModel, tmp_path: Path
) -> None:
    turns = [("system", STORY * 11), ("user", "Name the steps, in order.")]
    first = chat(smollm, turns)
    assert len(first) > 512  # two full blocks at least: what the disk tier holds
    core = core_for(smollm, tmp_path)
    answer, end = serve(core, Request("t1", first, SamplingParams(), 16))
    assert answer == reference(smollm, first, 16) and end.usage.cache_miss is CacheMiss.COLD
    second = chat(smollm, [*turns, ("assistant", answer), ("user", "And the last one?")])
    text, end = serve(core, Request("t2", second, SamplingParams(), 16))
    assert end.usage.cached_tokens >= len(first) - 1 and end.usage.cached_disk_tokens == 0
    assert text == reference(smollm, second, 16)
    store = core.prefix_cache
    assert isinstance(store, BlockStore) and store.disk is not None
    store.close()  # the engine stops: what it queued for the disk tier is on disk (its writer may lag)
    assert len(store.disk) >= 2

    restarted = core_for(smollm, tmp_path)  # a new engine: memory empty, the disk tier found again
    text, end = serve(restarted, Request("t2-again", second, SamplingParams(), 16))
    assert end.usage.cached_disk_tokens >= 512 and end.usage.cached_tokens >= 512
    assert text == reference(smollm, second, 16)
