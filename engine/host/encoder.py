"""An embedding model's engine (`--model all-minilm-l6-v2`) behind the same EngineClient the
server uses for generation: here on a thread of this process (`--engine thread`); the default,
engine.host.encoder_process, keeps this front (tokenizing, validation, the queue bound) and runs
the network in a child process.

Batching by arrival: calls queue as they come; the owner thread takes every call waiting, runs
their inputs together (sorted by length, cut into forwards by a token budget; engine.encoder),
and settles each call's future on the loop as soon as the group is done. No KV, no steps: a
call is one group's work. A call whose group fails is retried alone, so one bad input fails
only its own call. Generation routes are refused with a 400 naming the model (App.context).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from mlx_serve.engine.encoder.model import EncoderModel
from mlx_serve.engine.encoder.runner import embed_group
from mlx_serve.engine.errors import EngineUnavailable, InvalidRequest, QueueFull, ServeError
from mlx_serve.engine.host.client import Embeddings, EngineState, ModelInfo, RequestStream
from mlx_serve.engine.host.owner_thread import ThreadHost, to_loop
from mlx_serve.engine.model.tokenizer import ChatTokenizer
from mlx_serve.engine.types import EmbedInput, Request

log = logging.getLogger("mlx_serve.engine")
MAX_WAITING_INPUTS = 16384  # inputs queued or running before a call is answered 429


@dataclass(slots=True)
class EmbedCounters:
    embed_calls: int = 0
    embed_inputs: int = 0
    embed_tokens: int = 0
    embed_groups: int = 0  # times the owner thread took the calls waiting
    embed_seconds: float = 0.0

    def count(self, calls: Sequence[EmbedCall], seconds: float) -> None:
        self.embed_groups += 1
        self.embed_calls += len(calls)
        self.embed_inputs += sum(len(c.rows) for c in calls)
        self.embed_tokens += sum(len(r) for c in calls for r in c.rows)
        self.embed_seconds += seconds


@dataclass(frozen=True, slots=True)
class EmbedCall:
    rows: list[list[int]]
    dimensions: int | None
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop


class EncoderEngine(ThreadHost[EmbedCall]):
    """Owns the encoder and its thread; `embed()` is its one way in."""

    thread_name = "mlx-encoder"

    def __init__(
        self, load: Callable[[], EncoderModel], max_waiting_inputs: int = MAX_WAITING_INPUTS
    ) -> None:
        super().__init__(capacity=0)
        self._load = load
        self._encoder: EncoderModel | None = None
        self._waiting = 0
        self.max_waiting_inputs = max_waiting_inputs
        self.counters = EmbedCounters()

    async def stats(self) -> dict[str, Any]:
        return {"restarts": 0, "queued_inputs": self._waiting, **asdict(self.counters)}

    def submit(self, requests: Sequence[Request]) -> RequestStream:
        name = self._encoder.model_id if self._encoder else "this model"
        raise InvalidRequest(f"model '{name}' is an embedding model: use POST /v1/embeddings", param="model")

    def _deliver(self, stream: RequestStream) -> None:  # submit() refuses before it
        raise AssertionError("an encoder engine takes no generation requests")

    async def embed(self, inputs: Sequence[EmbedInput], dimensions: int | None = None) -> Embeddings:
        encoder = self._encoder
        if not self.ready or encoder is None:
            raise EngineUnavailable(f"model is {self.state.value}; try again shortly")
        encoder.check_dimensions(dimensions)
        rows = await asyncio.to_thread(encoder.rows, inputs)
        if self._waiting + len(rows) > self.max_waiting_inputs:
            raise QueueFull(
                f"the server has {self._waiting} inputs waiting to be embedded; retry shortly",
                retry_after_s=1,
            )
        loop = asyncio.get_running_loop()
        call = EmbedCall(rows, dimensions, loop.create_future(), loop)
        self._waiting += len(rows)
        try:
            self._dispatch(call)
            vectors = await call.future
        finally:
            self._waiting -= len(rows)
        return Embeddings(vectors, sum(len(r) for r in rows))

    def _dispatch(self, call: EmbedCall) -> None:
        """Hand a call to whoever runs the network: here, this engine's own thread."""
        self._inbox.put(call)

    def _main(self) -> None:
        try:
            encoder = self._load()
        except Exception as exc:  # noqa: BLE001 - any load failure is the model's: FAILED, said once
            self._failed_to_load(exc)
            return
        log.info(
            "embedding model %s: %d dimensions, context %d tokens",
            encoder.model_id, encoder.dimensions, encoder.context_length,
        )  # fmt: skip
        self._loaded_encoder(encoder)
        self.state = EngineState.READY
        self._serve(encoder)

    def _loaded_encoder(self, encoder: EncoderModel) -> None:
        self._encoder = encoder
        tokenizer = ChatTokenizer(encoder.tokenizer, encoder.context_length, 1)
        self.model = ModelInfo(encoder.model_id, tokenizer, encoder.context_length, encoder.dimensions)

    def _serve(self, encoder: EncoderModel) -> None:
        while (first := self._inbox.get()) is not None:
            calls = [first]
            stopping = False
            while not stopping:
                try:
                    nxt = self._inbox.get_nowait()
                except queue.Empty:
                    break
                stopping = nxt is None
                if nxt is not None:
                    calls.append(nxt)
            self._run(encoder, calls)
            if stopping:
                return

    def _run(self, encoder: EncoderModel, calls: list[EmbedCall]) -> None:
        started = time.perf_counter()
        outcomes = embed_group(encoder, [(c.rows, c.dimensions) for c in calls])
        for call, outcome in zip(calls, outcomes):
            settle(call, outcome)
        self.counters.count(calls, time.perf_counter() - started)


def settle(call: EmbedCall, outcome: np.ndarray | ServeError) -> None:
    """From the owner thread: hand a call its vectors (or its error) on the loop."""
    to_loop(call.loop, _resolve, call.future, outcome)


def _resolve(future: asyncio.Future[np.ndarray], outcome: np.ndarray | ServeError) -> None:
    if future.done():  # the client left and its call was cancelled
        return
    if isinstance(outcome, ServeError):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
