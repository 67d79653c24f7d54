"""A request's grammar is compiled in the engine process's reader thread, never on the step
loop, where a large one stalled every stream while it compiled (scripted core, real child)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from mlx_serve.engine.batch.core import Core
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.host.child import ChildPlan
from mlx_serve.engine.host.process import ProcessEngine
from mlx_serve.engine.types import Counters, Finished, Request, SamplingParams
from tests.engine.host.test_process import PIECES, drain
from tests.support.fake_engine import EOS, FakeTokenizer, ScriptedRunner


class StepLoopRefusesToCompile(Core):
    """A core whose grammar compile fails when it runs on the step loop (the child's main
    thread); elsewhere it returns a stand-in (the scripted runner ignores grammars)."""

    def _constraint(self, request: Request) -> Any:
        if request.grammar is None:
            return None
        if threading.current_thread() is threading.main_thread():
            raise InvalidRequest("the grammar was compiled on the step loop")
        return object()


def build(counters: Counters, _: Any) -> tuple[Core, dict[str, Any]]:
    scheduler = Scheduler(SchedulerConfig(max_running=4), frozenset({EOS}))
    core = StepLoopRefusesToCompile(scheduler, ScriptedRunner(PIECES, 0.0), FakeTokenizer(PIECES), counters)
    return core, {"model_id": "scripted"}


def test_the_grammar_is_compiled_off_the_step_loop() -> None:
    async def go() -> list[Any]:
        engine = ProcessEngine(lambda: ChildPlan("scripted", build, (None,), lambda: FakeTokenizer(PIECES)))
        engine.start()
        await engine.wait_ready()
        try:
            grammar = Request(
                id="g", prompt_tokens=(1, 2), sampling=SamplingParams(), max_tokens=3, grammar='start: "a"'
            )
            return await drain(engine.submit([grammar]))
        finally:
            engine.stop()

    events = asyncio.run(asyncio.wait_for(go(), 60))
    assert isinstance(events[-1], Finished)
