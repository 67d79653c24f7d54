"""Tier 2: the thread host (`--engine thread`) reports as the process host does: /stats counts
running and waiting requests as of now, inside a long step, and the model's facts (Ollama's
listings) come from its files. The real core loop and scheduler, a scripted runner, no MLX step."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from mlx_serve.engine.batch.core import Core
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.host.thread import ThreadEngine
from mlx_serve.engine.model.facts import model_facts
from mlx_serve.engine.model.loader import LoadedModel, default_gguf
from mlx_serve.engine.types import Counters, Request
from tests.support.fake_engine import EOS, FakeTokenizer, ScriptedRunner

PIECES = ["a", "b", "c"]


def engine_for(path: Path, step_s: float = 0.0) -> ThreadEngine:
    def load() -> LoadedModel:
        return LoadedModel(model=None, tokenizer=FakeTokenizer(PIECES), model_id="fake-model", path=path)

    def make(loaded: LoadedModel, counters: Counters) -> Core:
        scheduler = Scheduler(SchedulerConfig(max_running=1), frozenset({EOS}))
        return Core(scheduler, ScriptedRunner(PIECES, step_s), loaded.tokenizer, counters)

    return ThreadEngine(load, make)


def request(rid: str) -> Request:
    return Request(id=rid, prompt_tokens=(5, 6, 7), max_tokens=2)


async def drain(stream: Any) -> None:
    while await stream.next() is not None:
        pass


def test_thread_engine_stats_are_live_during_a_long_step() -> None:
    """Inside one long first step the admitted row is running, a request sent since waits, and
    a row cancelled since is gone (the loop's own gauges would read 0 / 0 until the step ends)."""

    async def counts(engine: ThreadEngine) -> tuple[int, int]:
        stats = await engine.stats()
        return stats["num_requests_running"], stats["num_requests_waiting"]

    async def go() -> list[tuple[int, int] | bool]:
        engine = engine_for(Path("."), step_s=3.0)
        engine.start()
        await engine.wait_ready()
        try:
            first = engine.submit([request("r1")])
            token = asyncio.ensure_future(first.next())
            for _ in range(200):  # admitted at once; its first step then lasts 3 s
                if (seen := await counts(engine)) == (1, 0):
                    break
                await asyncio.sleep(0.01)
            second = engine.submit([request("r2")])
            with_second = await counts(engine)
            in_step = not token.done()  # all of this inside r1's first step: no token yet
            first.cancel()
            after_abort = await counts(engine)
            await drain(second)
            token.cancel()
            return [seen, with_second, in_step, after_abort, await counts(engine)]
        finally:
            engine.stop()

    assert asyncio.run(go()) == [(1, 0), (1, 1), True, (0, 1), (0, 0)]


def test_thread_engine_knows_the_models_facts_from_its_files() -> None:
    path = default_gguf()  # the real default GGUF: its tensor table and file type

    async def go() -> Any:
        engine = engine_for(path)
        engine.start()
        try:
            await engine.wait_ready()
            assert engine.model is not None
            return engine.model.facts
        finally:
            engine.stop()

    facts = asyncio.run(go())
    assert facts is not None and facts == model_facts(path)  # as the process host reads them
    assert (facts.file_bytes, facts.parameters, facts.quantization) == (
        path.stat().st_size,
        134_515_008,
        "Q4_1",
    )
    assert facts.on_gpu is False  # this CPU: Ollama's /api/ps size_vram is 0
