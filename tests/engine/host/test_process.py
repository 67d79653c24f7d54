"""The process host on its own: a scripted core in a real child process (no MLX, no model).

The child is spawned as in production; only the core it builds is scripted (the real scheduler
and core loop over tests.support.fake_engine's runner).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from mlx_serve.engine.batch.core import Core
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.errors import EngineFailed
from mlx_serve.engine.host import spare as spare_module
from mlx_serve.engine.host.child import ChildPlan
from mlx_serve.engine.host.client import EngineState
from mlx_serve.engine.host.process import ProcessEngine
from mlx_serve.engine.host.spare import discard_spare, start_spare, take_spare
from mlx_serve.engine.types import Counters, Finished, Request, SamplingParams, TextDelta
from tests.support.fake_engine import EOS, FakeTokenizer, ScriptedRunner

PIECES = ["a", "b", "c"]


@dataclass(frozen=True)
class Script:
    step_s: float = 0.0
    load_error: str = ""
    fatal: bool = False
    pieces: tuple[str, ...] = tuple(PIECES)
    stop_marker: str = ""  # a file the core's on_stop writes, after a pause (a prompt cache's blocks)


def build_scripted(counters: Counters, script: Script) -> tuple[Core, dict[str, Any]]:
    """What engine.host.build.load_and_build does in the child, with a scripted runner."""
    if script.load_error:
        if script.fatal:
            from mlx_serve.engine.batch.admission import InsufficientMemory

            raise InsufficientMemory(script.load_error)
        raise RuntimeError(script.load_error)
    scheduler = Scheduler(SchedulerConfig(max_running=4), frozenset({EOS}))
    runner = ScriptedRunner(list(script.pieces), script.step_s)
    core = Core(scheduler, runner, FakeTokenizer(list(script.pieces)), counters)
    if script.stop_marker:

        def on_stop() -> None:
            time.sleep(1.0)
            Path(script.stop_marker).write_text("written")

        core.on_stop = on_stop
    return core, {"model_id": "scripted"}


def engine_for(script: Script) -> ProcessEngine:
    def prepare() -> ChildPlan:
        return ChildPlan("scripted", build_scripted, (script,), lambda: FakeTokenizer(list(script.pieces)))

    return ProcessEngine(prepare, capacity=8)


def request(rid: str, max_tokens: int = 16) -> Request:
    return Request(id=rid, prompt_tokens=(1, 2), sampling=SamplingParams(), max_tokens=max_tokens)


async def drain(stream: Any) -> list[Any]:
    out = []
    while (item := await stream.next()) is not None:
        out.append(item[1])
    return out


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_process_engine_serves_a_request_and_reports_the_model() -> None:
    async def go() -> tuple[list[Any], Any, dict[str, Any]]:
        engine = engine_for(Script())
        engine.start()
        await engine.wait_ready()
        try:
            events = await drain(engine.submit([request("r1")]))
            return events, engine.model, await engine.stats()
        finally:
            engine.stop()

    events, model, stats = run(go())
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "abc"
    assert isinstance(events[-1], Finished) and events[-1].usage.completion_tokens == 4
    assert model.model_id == "scripted" and model.tokenizer.vocab_size == 1000
    assert stats["requests_finished"] == 1 and stats["engine_pid"] > 0 and stats["restarts"] == 0


def watched(loop: asyncio.AbstractEventLoop, engine: ProcessEngine) -> bool:
    """Whether the loop watches the engine's frame socket (or reads it on a tick: engine.host.frames)."""
    child = engine._child
    assert child is not None and child.reader is not None
    try:
        loop._selector.get_key(child.reader.fileno())  # type: ignore[attr-defined]
    except KeyError:
        return False
    return True


async def stream_watching(engine: ProcessEngine, rid: str) -> tuple[list[Any], list[bool]]:
    """A request's events, and for each text event whether the frame socket was watched then."""
    loop = asyncio.get_running_loop()
    stream = engine.submit([request(rid, max_tokens=1000)])
    events, watching = [], []
    while (item := await stream.next()) is not None:
        events.append(item[1])
        if isinstance(item[1], TextDelta):
            watching.append(watched(loop, engine))
    return events, watching


def test_process_engine_reads_a_fast_stream_on_a_tick_then_watches_the_socket_again() -> None:
    """While a stream's frames come fast (2 ms steps) they wake no one: the loop does not watch
    the frame socket, it reads it on a tick (engine.host.frames); every event still arrives, in order.
    Once the stream is done the loop watches the socket again, so an idle engine still answers
    (its stats, the next request)."""
    pieces = tuple(f"w{i} " for i in range(120))

    async def go() -> tuple[list[Any], list[bool], bool, dict[str, Any], list[Any]]:
        engine = engine_for(Script(step_s=0.002, pieces=pieces))
        engine.start()
        await engine.wait_ready()
        try:
            events, watching = await stream_watching(engine, "r1")
            await asyncio.sleep(0.05)
            after = watched(asyncio.get_running_loop(), engine)
            stats = await engine.stats()
            again = await drain(engine.submit([request("r2", max_tokens=1000)]))
            return events, watching, after, stats, again
        finally:
            engine.stop()

    events, watching, after, stats, again = run(go())
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "".join(pieces)
    assert isinstance(events[-1], Finished) and events[-1].usage.completion_tokens == len(pieces) + 1
    assert len(watching) == len(pieces) and watching.count(False) >= len(pieces) // 2
    assert after and stats["requests_finished"] == 1
    assert "".join(e.text for e in again if isinstance(e, TextDelta)) == "".join(pieces)


def test_process_engine_keeps_watching_a_slow_stream() -> None:
    """Frames far apart (50 ms steps, as a large batch's are) keep waking the loop: no tick
    spends the server's CPU between them."""
    pieces = tuple(f"w{i} " for i in range(8))

    async def go() -> tuple[list[Any], list[bool]]:
        engine = engine_for(Script(step_s=0.05, pieces=pieces))
        engine.start()
        await engine.wait_ready()
        try:
            return await stream_watching(engine, "r1")
        finally:
            engine.stop()

    events, watching = run(go())
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "".join(pieces)
    assert len(watching) == len(pieces) and all(watching)


def test_process_engine_cancel_frees_the_gate_and_the_child_row() -> None:
    async def go() -> tuple[int, dict[str, Any]]:
        engine = engine_for(Script(step_s=0.05))
        engine.start()
        await engine.wait_ready()
        try:
            stream = engine.submit([request("r1", max_tokens=10_000)])
            await stream.next()
            stream.cancel()
            for _ in range(100):
                stats = await engine.stats()
                if stats["requests_aborted"] == 1:
                    break
                await asyncio.sleep(0.05)
            return engine.gate.inflight, stats
        finally:
            engine.stop()

    inflight, stats = run(go())
    assert inflight == 0 and stats["requests_aborted"] == 1


def test_process_engine_stats_are_live_during_a_long_step() -> None:
    """/stats is answered off the step loop with counts as of now: inside one long first step
    the admitted row is running, a request sent since waits, and a row aborted since is gone
    (the loop's own gauges would read 0 / 0 until the step ends)."""

    async def counts(engine: ProcessEngine) -> tuple[int, int]:
        stats = await engine.stats()
        return stats["num_requests_running"], stats["num_requests_waiting"]

    async def go() -> list[tuple[int, int] | bool]:
        engine = engine_for(Script(step_s=4.0))
        engine.start()
        await engine.wait_ready()
        try:
            first = engine.submit([request("r1", max_tokens=2)])
            token = asyncio.ensure_future(first.next())
            for _ in range(100):  # admitted at once; its first step then lasts 4 s
                if (seen := await counts(engine)) == (1, 0):
                    break
                await asyncio.sleep(0.01)
            second = engine.submit([request("r2", max_tokens=2)])
            with_second = await counts(engine)  # the Submit reaches the child before this query
            in_step = not token.done()  # all of this inside r1's first step: no token yet
            first.cancel()
            after_abort = await counts(engine)
            await drain(second)
            token.cancel()
            return [seen, with_second, in_step, after_abort]
        finally:
            engine.stop()

    assert run(go()) == [(1, 0), (1, 1), True, (0, 1)]


def break_mid_stream(
    hurt: Callable[[ProcessEngine], None],
) -> tuple[BaseException | None, int, int, int, list[Any]]:
    """A request decoding when `hurt` strikes the child: what that request got, the child's pid
    before and after, the restarts, and what a request after it gets."""

    async def go() -> tuple[BaseException | None, int, int, int, list[Any]]:
        engine = engine_for(Script(step_s=0.05))
        engine.start()
        await engine.wait_ready()
        try:
            stream = engine.submit([request("r1", max_tokens=10_000)])
            await stream.next()
            first_pid = engine.pid
            hurt(engine)
            failure: BaseException | None = None
            try:
                await drain(stream)
            except EngineFailed as exc:
                failure = exc
            await engine.wait_ready()
            again = await drain(engine.submit([request("r2")]))
            return failure, first_pid, engine.pid, engine.restarts, again
        finally:
            engine.stop()

    return cast("tuple[BaseException | None, int, int, int, list[Any]]", run(go()))


def test_process_engine_child_death_fails_inflight_then_restarts() -> None:
    failure, first_pid, second_pid, restarts, again = break_mid_stream(
        lambda e: os.kill(e.pid, signal.SIGKILL)
    )
    assert isinstance(failure, EngineFailed) and "engine process died" in str(failure)
    assert restarts == 1 and second_pid not in (0, first_pid) and isinstance(again[-1], Finished)


def test_process_engine_message_that_does_not_decode_fails_inflight_then_restarts() -> None:
    """Never a hang: a frame from the child that does not unpickle ends that child like a death."""
    from mlx_serve.engine.host.frames import HEADER

    def garble(engine: ProcessEngine) -> None:
        child = engine._child
        assert child is not None and child.reader is not None
        child.reader._buf += HEADER.pack(4) + b"\xff\xfe\xfd\xfc"  # the next frame read is garbage

    failure, first_pid, second_pid, restarts, again = break_mid_stream(garble)
    assert isinstance(failure, EngineFailed) and "engine process died" in str(failure)
    assert restarts == 1 and second_pid not in (0, first_pid) and isinstance(again[-1], Finished)


def test_process_engine_stopped_with_a_request_in_flight_fails_it() -> None:
    """Shutdown never leaves a stream waiting for events that will not come."""

    async def go() -> BaseException | None:
        engine = engine_for(Script(step_s=0.05))
        engine.start()
        await engine.wait_ready()
        stream = engine.submit([request("r1", max_tokens=10_000)])
        await stream.next()
        engine.stop()
        try:
            await drain(stream)
        except EngineFailed as exc:
            return exc
        return None

    assert isinstance(run(go()), EngineFailed)


def test_a_stopping_engine_process_finishes_its_own_stop_before_it_exits(tmp_path: Path) -> None:
    """A server's stop lets the child end as it would (its prompt cache writes its blocks to disk
    there: a restart starts from them) instead of killing it."""
    marker = tmp_path / "closed"

    async def go() -> int | None:
        engine = engine_for(Script(stop_marker=str(marker)))
        engine.start()
        await engine.wait_ready()
        child = engine._child
        assert child is not None
        await drain(engine.submit([request("r1")]))
        engine.stop()  # returns at once: the child is waited for off the event loop, by this thread
        for thread in threading.enumerate():
            if thread.name == "engine-stop":
                thread.join(20)
        return cast("int | None", child.process.exitcode)

    exitcode = run(go())
    assert marker.read_text() == "written"
    assert exitcode == 0


def test_the_first_engine_process_is_the_spare_started_at_launch_and_a_spare_not_taken_exits() -> None:
    """server.cli starts a spare engine process before its own start-up (engine.host.spare): the
    engine's first child is that process, already past its imports."""
    start_spare()
    spare = spare_module._spare
    assert spare is not None

    async def go() -> tuple[list[Any], dict[str, Any]]:
        engine = engine_for(Script())
        engine.start()
        await engine.wait_ready()
        try:
            return await drain(engine.submit([request("r1")])), await engine.stats()
        finally:
            engine.stop()

    events, stats = run(go())
    assert stats["engine_pid"] == spare[0].pid and isinstance(events[-1], Finished)
    assert take_spare() is None  # taken once
    start_spare()
    unused = spare_module._spare
    assert unused is not None
    discard_spare()  # an embedding model or a thread host never takes it
    assert not unused[0].is_alive() and take_spare() is None


@pytest.mark.parametrize("fatal", [False, True])
def test_process_engine_load_failure_is_fatal(fatal: bool) -> None:
    told: list[str] = []

    async def go() -> tuple[EngineState, str | None]:
        engine = engine_for(Script(load_error="weights missing", fatal=fatal))
        engine.on_fatal = told.append
        engine.start()
        with pytest.raises(Exception, match="weights missing"):
            await engine.wait_ready()
        engine.stop()
        return engine.state, engine.error

    state, error = run(go())
    assert error is not None and "weights missing" in error
    assert state is EngineState.STOPPED
    kind = "InsufficientMemory" if fatal else "RuntimeError"
    assert told == [f"cannot load the model: {kind}: weights missing"]  # the server exits 1 with it
