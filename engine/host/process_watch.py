"""ProcessEngine's watchdog (engine.host.watchdog's policy over the child process), a mixin
kept apart from the host's pipe and lifecycle."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mlx_serve.engine.errors import EngineFailed
from mlx_serve.engine.host.client import EngineState
from mlx_serve.engine.host.process_messages import Abort, StatsQuery
from mlx_serve.engine.host.watchdog import TICK_S, Progress

log = logging.getLogger("mlx_serve.engine")
WATCH_NONCE = -1  # the watchdog's own StatsQuery


class ProcessWatchdog:
    """Every tick with work in flight: ask the child its step count; fail and restart (or wait
    for) a child that has not stepped for `progress.stall_s`."""

    progress: Progress
    restart_stalled: bool
    state: EngineState
    error: str | None
    _loop: asyncio.AbstractEventLoop | None
    _stopping: bool
    _child: Any
    _watching: asyncio.TimerHandle | None = None

    def _send(self, child: Any, message: Any) -> bool:
        raise NotImplementedError

    def _watch(self) -> None:
        if self._stopping or self._loop is None:
            return
        self._watching = self._loop.call_later(TICK_S, self._watch)
        child, now = self._child, self._loop.time()
        if child is None or not child.streams or self.state not in (EngineState.READY, EngineState.STALLED):
            self.progress.idle(now)
            return
        self.progress.working(now)
        self._send(child, StatsQuery(WATCH_NONCE))
        why = self.progress.stalled(now)
        if why is not None and self.state is EngineState.READY:
            self._stalled(child, why)

    def _stalled(self, child: Any, why: str) -> None:
        """Work in flight and no answer, or no step: its streams fail now, /health says so."""
        message = f"engine not responding: {why}"
        log.error("%s; %s", message, "restarting it" if self.restart_stalled else "waiting for it")
        for request_id, stream in child.streams.items():
            stream.push(request_id, EngineFailed(message))
            self._send(child, Abort(request_id))
        child.streams.clear()
        self.state, self.error = EngineState.STALLED, message
        if self.restart_stalled:
            child.process.kill()  # then as any death: the reader sees the end and a new child starts

    def _moved(self) -> None:
        """The child answered with progress: a stalled engine that moves again is healthy."""
        if self.state is EngineState.STALLED and not self.restart_stalled:
            log.warning("the engine is stepping again")
            self.state, self.error = EngineState.READY, None

    def _events_came(self) -> None:
        if self._loop is not None:
            self.progress.moved(self._loop.time())
            self._moved()

    def _steps_came(self, counters: dict[str, Any]) -> None:
        if self._loop is not None:
            before = self.progress.moved_at
            self.progress.saw(int(counters.get("engine_steps", 0)), self._loop.time())
            if self.progress.moved_at != before:
                self._moved()
