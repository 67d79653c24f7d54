"""An embedding model's engine in a child process (the default `--engine process`): an MLX
crash or out-of-memory kills only the child. The parent keeps the tokenizer and the model's
facts (tokenizing, validation and the queue bound stay in engine.host.encoder's `embed`), and
sends each call's token rows over a pipe; the child takes every call waiting (batching by
arrival, as on a thread) and answers each call's vectors. When the child dies, the calls in
flight fail with a 500, /health turns 503, and a new child is started.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import queue
import threading
import time
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from mlx_serve.engine.encoder.loader import load_encoder
from mlx_serve.engine.encoder.runner import embed_group
from mlx_serve.engine.errors import EngineFailed
from mlx_serve.engine.host.client import EngineState
from mlx_serve.engine.host.encoder import MAX_WAITING_INPUTS, EmbedCall, EncoderEngine, settle

log = logging.getLogger("mlx_serve.engine")
READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 5.0


class EncoderProcessEngine(EncoderEngine):
    """The encoder's network in a restartable child; everything else as EncoderEngine."""

    def __init__(self, spec: str, max_waiting_inputs: int = MAX_WAITING_INPUTS) -> None:
        super().__init__(partial(load_encoder, spec, weights=False), max_waiting_inputs)
        self._spec = spec
        self._pending: dict[int, EmbedCall] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._outbox: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._child: Any = None
        self._conn: Connection | None = None
        self._stopping = False
        self.restarts = 0
        self.pid: int | None = None

    async def stats(self) -> dict[str, Any]:
        return {**await super().stats(), "restarts": self.restarts}

    def stop(self) -> None:
        self._stopping = True
        self._outbox.put(None)
        if self._child is not None:
            self._child.join(STOP_TIMEOUT_S)
            if self._child.is_alive():
                self._child.terminate()
        self.state = EngineState.STOPPED

    def _dispatch(self, call: EmbedCall) -> None:
        call_id = next(self._ids)
        with self._lock:
            self._pending[call_id] = call
        self._outbox.put(("embed", call_id, call.rows, call.dimensions))

    def _main(self) -> None:
        try:
            encoder = self._load()  # the tokenizer and facts; the weights load in the child
            self._spawn()
        except Exception as exc:  # noqa: BLE001 - any load failure is the model's: FAILED, said once
            self._failed_to_load(exc)
            return
        log.info(
            "embedding model %s: %d dimensions, context %d tokens (in process %s)",
            encoder.model_id, encoder.dimensions, encoder.context_length, self.pid,
        )  # fmt: skip
        self._loaded_encoder(encoder)
        self.state = EngineState.READY
        threading.Thread(target=self._send_loop, name="mlx-encoder-send", daemon=True).start()
        self._read_loop()

    def _spawn(self) -> None:
        parent, child = mp.get_context("spawn").Pipe()
        proc = mp.get_context("spawn").Process(
            target=serve_encoder_child, args=(self._spec, child), name="mlx-serve-encoder", daemon=True
        )
        proc.start()
        child.close()
        if not parent.poll(READY_TIMEOUT_S):
            proc.terminate()
            raise TimeoutError(f"the encoder process was not ready in {READY_TIMEOUT_S:.0f} s")
        try:
            first = parent.recv()
        except EOFError:
            raise RuntimeError(f"the encoder process exited while loading (code {proc.exitcode})") from None
        if first[0] != "ready":
            raise RuntimeError(first[1])
        self._child, self._conn, self.pid = proc, parent, proc.pid

    def _send_loop(self) -> None:
        while (message := self._outbox.get()) is not None:
            try:
                if self._conn is not None:
                    self._conn.send(message)
            except (OSError, ValueError):  # the child is gone
                with self._lock:
                    call = self._pending.pop(message[1], None)
                if call is not None:
                    settle(call, EngineFailed("the encoder process is restarting; retry"))
        try:
            if self._conn is not None:
                self._conn.send(("stop",))
        except (OSError, ValueError):
            pass

    def _read_loop(self) -> None:
        while not self._stopping:
            assert self._conn is not None
            try:
                message = self._conn.recv()
            except (EOFError, OSError):
                if self._stopping:
                    return
                self._restart()
                continue
            self._done(message[1], message[2])

    def _done(self, outcomes: list[tuple[int, np.ndarray | str]], seconds: float) -> None:
        calls = []
        for call_id, outcome in outcomes:
            with self._lock:
                call = self._pending.pop(call_id, None)
            if call is not None:
                calls.append(call)
                settle(call, EngineFailed(outcome) if isinstance(outcome, str) else outcome)
        self.counters.count(calls, seconds)

    def _restart(self) -> None:
        """The child died: fail what it held, start another, serve again."""
        if self._child is not None:
            self._child.join(STOP_TIMEOUT_S)  # reaped, so its exit code is known
        code = self._child.exitcode if self._child is not None else None
        log.error("the encoder process exited (code %s); restarting it", code)
        self.state, self.error = EngineState.LOADING, f"the encoder process exited (code {code})"
        with self._lock:
            lost, self._pending = list(self._pending.values()), {}
        for call in lost:
            settle(call, EngineFailed(f"the encoder process exited (code {code}) during this call; retry"))
        try:
            self._spawn()
        except Exception as exc:
            log.exception("cannot restart the encoder")
            self.error, self.state = f"cannot restart the encoder: {exc}", EngineState.FAILED
            self._stopping = True
            return
        self.restarts += 1
        self.state, self.error = EngineState.READY, None


def serve_encoder_child(spec: str, conn: Connection) -> None:
    """The child's whole life: load the model, then take every call waiting and answer each."""
    try:
        encoder = load_encoder(spec)
    except Exception as exc:
        log.debug("the encoder failed to load", exc_info=True)
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready",))
    while True:
        try:
            messages = [conn.recv()]
            while conn.poll(0):
                messages.append(conn.recv())
        except EOFError:
            return
        calls = [m for m in messages if m[0] == "embed"]
        if calls:
            started = time.perf_counter()
            outcomes = embed_group(encoder, [(m[2], m[3]) for m in calls])
            answers = [
                (m[1], o.message if isinstance(o, EngineFailed) else o) for m, o in zip(calls, outcomes)
            ]
            conn.send(("done", answers, time.perf_counter() - started))
        if any(m[0] == "stop" for m in messages):
            return
