"""The engine watchdog and the outbox: a scripted core in a real child process, stopped with
SIGSTOP as an engine that hangs would be (no MLX, no model)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from typing import Any

from mlx_serve.engine.errors import EngineFailed, EngineUnavailable
from mlx_serve.engine.host.child import ChildPlan
from mlx_serve.engine.host.client import EngineState
from mlx_serve.engine.host.process import ProcessEngine
from mlx_serve.engine.types import Request, SamplingParams
from tests.engine.host.test_process import Script, build_scripted, drain
from tests.support.fake_engine import FakeTokenizer

STALL_S = 1.5


def engine_for(script: Script, restart: bool) -> ProcessEngine:
    def prepare() -> ChildPlan:
        return ChildPlan("scripted", build_scripted, (script,), lambda: FakeTokenizer(list(script.pieces)))

    return ProcessEngine(prepare, capacity=1024, stall_s=STALL_S, restart_stalled=restart)


def request(rid: str, prompt: int = 2, max_tokens: int = 10_000) -> Request:
    return Request(
        id=rid, prompt_tokens=tuple([1] * prompt), sampling=SamplingParams(), max_tokens=max_tokens
    )


def bounded(coro: Any, timeout_s: float = 60) -> Any:
    """Run `coro` on a thread's own loop: a blocked loop cannot hang the test past `timeout_s`."""
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(result=asyncio.run(coro)), daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), "the event loop was blocked"
    return out["result"]


def test_a_stopped_engine_fails_its_streams_reads_unhealthy_and_is_restarted() -> None:
    async def go() -> tuple[list[Any], str, str | None, int, int, list[Any]]:
        engine = engine_for(Script(step_s=0.02), restart=True)
        engine.start()
        await engine.wait_ready()
        first_pid = engine.pid
        stream = engine.submit([request("long")])
        await stream.next()  # it is decoding
        os.kill(first_pid, signal.SIGSTOP)
        got: list[Any] = []
        try:
            while (item := await stream.next()) is not None:
                got.append(item[1])
        except EngineFailed as exc:
            got.append(exc)
        state, error = engine.state.value, engine.error
        while engine.state is not EngineState.READY:  # killed and started again
            await asyncio.sleep(0.05)
        after = await drain(engine.submit([request("after", max_tokens=3)]))
        engine.stop()
        return got, state, error, first_pid, engine.pid, after

    got, state, error, first_pid, new_pid, after = bounded(go())
    assert isinstance(got[-1], EngineFailed) and "not responding" in got[-1].message
    assert state in ("not responding", "loading") and error is not None
    assert new_pid != first_pid and after[-1].reason.value == "length"


def test_sends_to_a_stopped_engine_never_block_the_loop_and_past_the_outbox_are_503() -> None:
    async def go() -> tuple[int, int, str, str]:
        engine = engine_for(Script(step_s=0.02), restart=False)
        engine.start()
        await engine.wait_ready()
        stream = engine.submit([request("long")])
        await stream.next()
        os.kill(engine.pid, signal.SIGSTOP)
        accepted = refused = 0
        try:
            for i in range(400):  # long prompts: the pipe fills after a few
                try:
                    engine.submit([request(f"big{i}", prompt=20_000, max_tokens=1)])
                    accepted += 1
                except EngineUnavailable:
                    refused += 1
                await asyncio.sleep(0)
            while engine.state is EngineState.READY:
                await asyncio.sleep(0.05)
            stalled = engine.state.value
        finally:
            os.kill(engine.pid, signal.SIGCONT)
        while engine.state is not EngineState.READY:  # it steps again: healthy again
            await asyncio.sleep(0.05)
        recovered = engine.state.value
        engine.stop()
        return accepted, refused, stalled, recovered

    accepted, refused, stalled, recovered = bounded(go())
    assert refused > 0 and accepted > 0
    assert stalled == "not responding" and recovered == "ready"


def test_a_slow_step_that_still_answers_is_not_a_hang_but_silence_is() -> None:
    from mlx_serve.engine.host.watchdog import STEP_LIMIT_FACTOR, Progress

    slow = Progress(stall_s=30)
    slow.working(0.0)
    for t in range(1, 200):  # one long prefill step: the reader answers every second, steps stay put
        slow.saw(steps=7, now=float(t))
        assert slow.stalled(float(t)) is None
    stuck_for = STEP_LIMIT_FACTOR * 30 + 2  # the count last moved at t = 1
    for t in range(200, stuck_for + 1):
        slow.saw(steps=7, now=float(t))
    assert "no step" in (slow.stalled(float(stuck_for)) or "")

    silent = Progress(stall_s=30)
    silent.working(0.0)
    silent.saw(steps=3, now=1.0)
    assert silent.stalled(30.0) is None
    assert "no answer" in (silent.stalled(31.5) or "")
    assert Progress(stall_s=0).stalled(1e9) is None  # off
