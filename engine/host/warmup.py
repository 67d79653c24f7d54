"""Compiling the usual kernel shapes: what a first burst meets before ready, the rest while idle.

MLX's GPU backends compile a kernel the first time it meets a new shape (on CUDA through
NVRTC, cached on disk across restarts; on Metal some kernels are JIT-built too). Unwarmed, the
first requests a server sees pay for it: on the H200 a fresh server's first 16-client burst
waited seconds for its first tokens. So the engine runs a few throwaway requests through a
runner of its own (no prefix cache: nothing is kept), the way the scheduler will: prompts of
several lengths alone, then bursts that grow the decode batch to each power of two up to its
rows. Before /health turns ready it runs what a first burst of up to READY_ROWS clients meets
(the prompt lengths and the bursts up to that size); the larger bursts, most of the warm-up's
time (480 of its 511 rows at 256), run as idle work (Core.idle_work): one batch step per pass of
the engine's loop, only while no request is in the engine and once it has gone a second without
a step, so start-up does not wait for them and a request that arrives waits at most for the step
under way; the burst it interrupted is dropped (its KV freed) and runs again from its start later.
On a CPU it does nothing: MLX's CPU backend compiles no kernel per shape; it builds its few
fused kernels (mx.compile'd activations) with the system C++ compiler the first time a process
meets each one and keeps them on disk ($TMPDIR/mlx/<version>/cpu). A fresh machine's first
request pays that once (SmolLM2: one kernel, ~0.6 s on a 2-core x86 box), and a fresh server's
first 16-client burst there measured 1.39-1.64x the warmed TTFT p95 (docs/performance.md), inside
issue 19's 2x; warming it before ready would cost every start-up a forward pass instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import mlx.core as mx

from mlx_serve.engine.batch.runner import BatchRunner
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.model.mlx_boundary import Model
from mlx_serve.engine.types import Request, SamplingParams

log = logging.getLogger("mlx_serve.engine")

PROMPT_LENGTHS = (16, 37, 64, 100, 128, 200, 256, 512)  # a ladder of prefill shapes
BURST_PROMPT = 64
READY_ROWS = 16  # bursts up to this many rows are warmed before ready; larger ones while idle


def warm_up(
    model: Model,
    config: SchedulerConfig,
    vocab_size: int,
    gpu_only: bool = True,
    bucket_prefill: bool = False,
) -> IdleBursts | None:
    """Runs the warm-up's part before ready now and returns the rest as idle work (None on a
    CPU, unless gpu_only is off)."""
    if gpu_only and mx.default_device().type != mx.DeviceType.gpu:
        return None
    sizes = [n for n in PROMPT_LENGTHS if n <= config.token_budget]
    bursts = [1 << i for i in range(config.max_running.bit_length())]  # 1, 2, 4, ... <= max_running
    now = [[_request(f"len{n}", n, vocab_size)] for n in sizes] + [
        _burst(b, vocab_size) for b in bursts if b <= READY_ROWS
    ]
    later = [_burst(b, vocab_size) for b in bursts if b > READY_ROWS]
    began = time.perf_counter()
    for unit in now:
        for _ in _steps(model, config, unit, bucket_prefill):
            pass
    log.info(
        "warm-up: kernels for %d prompt lengths and batches up to %d rows in %.1f s%s",
        len(sizes),
        max(b for b in bursts if b <= READY_ROWS),
        time.perf_counter() - began,
        f"; up to {bursts[-1]} rows while idle" if later else "",
    )
    return IdleBursts(model, config, later, bucket_prefill) if later else None


class IdleBursts:
    """The larger bursts as the core's idle work (engine.batch.core.IdleWork): one batch step per
    step(); pause() drops the burst under way, which starts again at the next step()."""

    def __init__(
        self, model: Model, config: SchedulerConfig, bursts: list[list[Request]], bucket_prefill: bool = False
    ) -> None:
        self._model, self._config, self._bucket = model, config, bucket_prefill
        self._bursts = list(bursts)
        self._largest = max(len(b) for b in bursts)
        self._current: Iterator[None] | None = None
        self._took = 0.0
        self.restarts = 0  # bursts dropped for a request and run again

    def step(self) -> bool:
        if not self._bursts:
            return False
        began = time.perf_counter()
        if self._current is None:
            self._current = _steps(self._model, self._config, self._bursts[0], self._bucket)
        try:
            next(self._current)
        except StopIteration:
            self._current = None
            self._bursts.pop(0)
        self._took += time.perf_counter() - began
        if self._bursts:
            return True
        log.info(
            "warm-up while idle: batches up to %d rows in %.1f s (%d restarted for requests)",
            self._largest,
            self._took,
            self.restarts,
        )
        return False

    def pause(self) -> None:
        if self._current is not None:
            self._current = None  # the burst's runner, scheduler and KV cache go with it
            self.restarts += 1


def _burst(rows: int, vocab_size: int) -> list[Request]:
    return [_request(f"b{rows}-{i}", BURST_PROMPT + i % 8, vocab_size) for i in range(rows)]


def _request(rid: str, length: int, vocab_size: int) -> Request:
    tokens = tuple(1 + (7 * i) % max(1, min(vocab_size - 1, 1000)) for i in range(length))
    return Request(f"warmup-{rid}", tokens, SamplingParams(), max_tokens=3)


def _steps(
    model: Model, config: SchedulerConfig, requests: list[Request], bucket_prefill: bool = False
) -> Iterator[None]:
    """The requests together, as the scheduler admits them, on a runner of their own; yields
    after each batch step."""
    runner = BatchRunner(model, prefill_step_size=config.token_budget, bucket_prefill=bucket_prefill)
    sched = Scheduler(config, frozenset())
    for r in requests:
        sched.add(r)
    while sched.has_work:
        plan = sched.schedule()
        for sid in plan.admitted:
            seq = sched.get(sid)
            assert seq is not None
            runner.admit(seq.request)
        sched.update(plan, runner.step(plan))
        yield
