"""The engine in a child process: an MLX crash or out-of-memory kills only the child.

The parent keeps the tokenizer (protocols need it) and talks to the child over a pipe with
small pickled messages; the child batches every event of a step into one message. When the
child dies, in-flight requests fail with an error in their own format, /health turns 503, and
a new child is started and serves the next request.

How the loop reads the child's frames (woken, or on a tick while they come fast): engine.host.frames.
Messages to the child go through a bounded outbox written by its own thread (engine.host.outbox),
and a watchdog fails the work of a child that stops stepping (engine.host.watchdog).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing as mp
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from mlx_serve.engine.errors import EngineFailed, EngineUnavailable, ServeError
from mlx_serve.engine.host.child import ChildPlan, ChildProcess
from mlx_serve.engine.host.client import EngineClient, EngineState, RequestStream
from mlx_serve.engine.host.frames import POLL_GAP_S, POLL_S, FrameReader
from mlx_serve.engine.host.outbox import Outbox
from mlx_serve.engine.host.owner_thread import to_loop
from mlx_serve.engine.host.process_child import serve_child
from mlx_serve.engine.host.process_messages import Abort, Events, LoadFailed, Ready, Stats, StatsQuery, Submit
from mlx_serve.engine.host.process_watch import WATCH_NONCE, ProcessWatchdog
from mlx_serve.engine.host.spare import take_spare
from mlx_serve.engine.host.watchdog import STALL_S, TICK_S, Progress
from mlx_serve.engine.model.tokenizer import spelling_span, warm_prompt_path
from mlx_serve.engine.types import Finished

log = logging.getLogger("mlx_serve.engine")
STATS_TIMEOUT_S = 5.0
# A stopping child ends its step and writes its prompt cache's blocks to disk before it exits
# (engine.batch.block_store's close, bounded by engine.batch.disk_tier.CLOSE_WRITE_S).
STOP_GRACE_S = 30.0


class ProcessEngine(ProcessWatchdog, EngineClient):
    """The model in a restartable child process; the tokenizer stays here for the protocols."""

    def __init__(
        self,
        prepare: Callable[[], ChildPlan],
        capacity: int = 1 << 30,
        waiting: int | None = None,
        restartable: bool = True,  # False: a rank of a sharded group (engine.host.shard), which restarts whole
        stall_s: float = STALL_S,  # the watchdog: no step for this long with work in flight
        restart_stalled: bool = True,  # and then kill and restart the child (False: wait for it)
    ) -> None:
        super().__init__(capacity, waiting)
        self.progress = Progress(stall_s)
        self.restart_stalled = restart_stalled
        self._prepare = prepare
        self.restartable = restartable
        self._plan: ChildPlan | None = None
        self._tokenizer: Any = None
        self._span = 0
        self._ready_info: dict[str, Any] | None = None  # the child is up; the tokenizer may not be
        self.restarts = 0
        self.info: dict[str, Any] = {}
        self._child: ChildProcess | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._nonces = itertools.count()
        self._stats_waiters: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._stopping = False

    @property
    def pid(self) -> int:
        return self._child.pid if self._child else 0

    def start(self) -> None:
        """Find/convert the model off the loop, spawn the child, and load the tokenizer here
        while the child loads the weights."""
        self._loop = asyncio.get_running_loop()
        threading.Thread(target=self._prepare_then_spawn, name="engine-prepare", daemon=True).start()
        self._watching = self._loop.call_later(TICK_S, self._watch)

    def _prepare_then_spawn(self) -> None:
        try:
            self._plan = self._prepare()
            self._hand_over(self._spawn)
            tokenizer = self._plan.load_tokenizer()
            span = spelling_span(tokenizer)  # here, off the event loop
            warm_prompt_path(tokenizer)
        except Exception as exc:
            log.debug("model preparation failed", exc_info=True)
            self._hand_over(self._load_failed, f"cannot load the model: {type(exc).__name__}: {exc}")
            return
        self._hand_over(self._tokenizer_loaded, tokenizer, span)

    def _tokenizer_loaded(self, tokenizer: Any, span: int) -> None:
        self._tokenizer, self._span = tokenizer, span
        self._maybe_ready()

    def _maybe_ready(self) -> None:
        if self._tokenizer is None or self._ready_info is None or self.state is EngineState.FAILED:
            return
        assert self._plan is not None
        info = self._ready_info
        self._loaded(
            self._plan.model_id, self._tokenizer, info.get("memory_plan"), self._span, info.get("facts")
        )
        self.state, self.error = EngineState.READY, None

    def _load_failed(self, error: str) -> None:
        """Nothing to serve: a restart cannot fix a model that does not load or fit."""
        self.state, self.error = EngineState.FAILED, error
        if self.on_fatal is not None:
            self.on_fatal(error)  # the server says it once, and exits
        else:
            log.error("%s", error)

    def _spawn(self) -> None:
        plan = self._plan
        if plan is None or self._stopping:
            return
        args = (plan.build, plan.build_args, logging.getLogger().getEffectiveLevel())
        spare = take_spare()  # started at launch, its imports done meanwhile (engine.host.spare)
        if spare is not None:
            proc, parent = spare
            parent.send((serve_child, args))
        else:
            ctx = mp.get_context("spawn")
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=serve_child, args=(child, *args), name="mlx-serve-engine", daemon=True)
            proc.start()
            child.close()
        self._child = ChildProcess(proc, parent, Outbox(parent), reader=FrameReader(parent.fileno()))
        assert self._loop is not None and self._child.reader is not None
        self._loop.add_reader(self._child.reader.fileno(), self._readable, self._child)

    def stop(self) -> None:
        self._stopping = True
        child, self._child = self._child, None
        self.state = EngineState.STOPPED
        if child is not None:
            self._stop_reading(child)
            child.outbox.close()
            _end_of_requests(child.conn)  # the child's reader meets the end: it stops as it would
            # waited for off the event loop; not a daemon thread, so this process outlives it
            threading.Thread(target=_reap, args=(child.process,), name="engine-stop", daemon=False).start()
            self._on_death(child, child.process.exitcode)  # any stream still open gets its error

    def _accepting(self) -> bool:
        return self.ready and self._child is not None

    def _deliver(self, stream: RequestStream) -> None:
        child = self._child
        assert child is not None
        if child.outbox.room() < len(stream.tickets):  # the child has stopped reading
            raise EngineUnavailable(
                "the engine is not taking requests just now (its queue is full); retry shortly"
            )
        for ticket in stream.tickets:
            child.streams[ticket.request.id] = stream
            self._send(child, Submit(ticket.request))

    def _abort(self, request_id: str) -> None:
        if self._child is not None:
            self._send(self._child, Abort(request_id))

    async def stats(self) -> dict[str, Any]:
        """The child's counters, asked for now (so they are never stale)."""
        child = self._child
        base = {"restarts": self.restarts, "engine_pid": self.pid}
        if child is None or not self.ready:
            return base
        nonce = next(self._nonces)
        waiter = asyncio.get_running_loop().create_future()
        self._stats_waiters[nonce] = waiter
        self._send(child, StatsQuery(nonce))
        try:
            return {**base, **await asyncio.wait_for(waiter, STATS_TIMEOUT_S)}
        except TimeoutError:
            raise EngineUnavailable(f"the engine did not answer within {STATS_TIMEOUT_S:g} s") from None
        finally:
            self._stats_waiters.pop(nonce, None)

    def _send(self, child: ChildProcess, message: Any) -> bool:
        """Queue a message for the child, never blocking the loop; False when its outbox is full
        (a child that stops reading: the watchdog deals with it; the pipe's end, with one gone)."""
        return child.outbox.put(message)

    # -- the child's messages, read on the loop (engine.host.frames) ------------------------

    def _readable(self, child: ChildProcess) -> None:  # the socket is watched unless frames come fast
        if not self._read(child) or child.reader is None or self._loop is None:
            return
        now = self._loop.time()
        fast, child.last_frame = now - child.last_frame < POLL_GAP_S, now
        if fast and child.streams:  # read on the tick from now on: a send then wakes no one
            self._loop.remove_reader(child.reader.fileno())
            child.polling = self._loop.call_later(POLL_S, self._poll, child)

    def _poll(self, child: ChildProcess) -> None:
        child.polling = None
        assert self._loop is not None  # started; _stop_reading cancels the tick with the reader
        got, now = self._read(child), self._loop.time()
        if child.reader is None:  # gone while reading
            return
        if got:
            child.last_frame = now
        if child.streams and now - child.last_frame < POLL_GAP_S:
            child.polling = self._loop.call_later(POLL_S, self._poll, child)
        else:  # level-triggered: a frame that arrived since this read wakes the loop at once
            self._loop.add_reader(child.reader.fileno(), self._readable, child)

    def _read(self, child: ChildProcess) -> int:
        """Handle every message that has arrived; how many there were."""
        reader = child.reader
        if reader is None:
            return 0
        try:
            messages = reader.read()
        except Exception:  # a frame that does not decode: nothing after it can be trusted
            log.exception("unreadable message from engine process %s; killing it", child.pid)
            child.process.kill()  # then as if it died: its requests fail and a new child starts
            self._gone(child)
            return 0
        for message in messages:
            try:
                self._on_message(child, message)
            except Exception:  # one message's handling failing leaves the others theirs
                log.exception("handling a message from the engine process failed")
        if reader.closed:
            self._gone(child)
        return len(messages)

    def _gone(self, child: ChildProcess) -> None:
        """The child's end is closed: stop reading it and wait for its exit code off the loop."""
        self._stop_reading(child)
        threading.Thread(target=self._reap, args=(child,), name="engine-reap", daemon=True).start()

    def _stop_reading(self, child: ChildProcess) -> None:
        reader, child.reader = child.reader, None
        if child.polling is not None:
            child.polling.cancel()
            child.polling = None
        if reader is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(reader.fileno())  # False (nothing done) while it was polled
        reader.close()

    def _reap(self, child: ChildProcess) -> None:
        child.process.join(5)
        self._hand_over(self._on_death, child, child.process.exitcode)

    def _hand_over(self, handler: Callable[..., None], *args: Any) -> bool:
        """Run `handler` on the loop; False once the loop has closed (the server has stopped)."""
        assert self._loop is not None
        return to_loop(self._loop, handler, *args)

    def _on_message(self, child: ChildProcess, message: Any) -> None:
        if isinstance(message, Events):
            self._events_came()
            for request_id, ev in message.items:
                stream = child.streams.get(request_id)
                if stream is not None:
                    stream.push(request_id, ev)
                    if isinstance(ev, (Finished, ServeError)):
                        child.streams.pop(request_id, None)
        elif isinstance(message, Stats) and message.nonce == WATCH_NONCE:
            self._steps_came(message.counters)
        elif isinstance(message, Stats):
            waiter = self._stats_waiters.get(message.nonce)
            if waiter is not None and not waiter.done():
                waiter.set_result(message.counters)
        elif isinstance(message, Ready):
            child.pid, self.info, self._ready_info = message.pid, message.info, message.info
            self._maybe_ready()
        elif isinstance(message, LoadFailed):
            self._load_failed(message.error)

    def _on_death(self, child: ChildProcess, exitcode: int | None) -> None:
        child.outbox.close()
        message = f"the engine process died (exit code {exitcode}); it is restarting"
        if self._stopping:
            message = "the server is stopping: the engine process ends"
        elif not self.restartable:  # one rank of a group cannot rejoin it: the group restarts whole
            from mlx_serve.engine.host.shard import group_lost_message

            shard = self.info.get("shard") or {}
            message = group_lost_message(exitcode, shard.get("mode", ""), shard.get("size", 0))
        for request_id, stream in child.streams.items():
            stream.push(request_id, EngineFailed(message))
        child.streams.clear()
        if self._stopping or child is not self._child or self.state is EngineState.FAILED:
            return
        self.progress.idle(self._loop.time() if self._loop is not None else 0.0)
        if not self.restartable:
            from mlx_serve.engine.host.shard import GROUP_LOST_GRACE_S

            log.error("%s", message)
            self.state, self.error = EngineState.FAILED, message
            if self.on_fatal is not None and self._loop is not None:  # /health says 503 a while, then exit
                self._loop.call_later(GROUP_LOST_GRACE_S, self.on_fatal, message)
            return
        log.error("engine process %s died with exit code %s; restarting", child.pid, exitcode)
        self.restarts += 1
        self.state, self.error = EngineState.LOADING, f"engine process died (exit code {exitcode})"
        self._spawn()


def _reap(process: Any) -> None:
    """A stopping child's end: on its own within STOP_GRACE_S, else terminated."""
    process.join(STOP_GRACE_S)
    if process.is_alive():
        process.terminate()
        process.join(5)


def _end_of_requests(conn: Any) -> None:
    """Shut the server's half of the pipe for writing (through a duplicate of its socket, so the
    outbox's thread and `conn` keep valid descriptors): the child reads the end of its requests."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # already closed, or the child is gone
