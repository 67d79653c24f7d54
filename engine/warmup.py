"""Compiling the usual kernel shapes: what a first burst meets before ready, the rest while idle.

MLX's GPU backends compile a kernel the first time it meets a new shape (on CUDA through
NVRTC, cached on disk across restarts; on Metal some kernels are JIT-built too). Unwarmed, the
first requests a server sees pay for it: on the H200 a fresh server's first 16-client burst
waited seconds for its first tokens. So the engine runs a few throwaway requests through a
runner of its own (no prefix cache: nothing is kept), the way the scheduler will: prompts of
several lengths alone, then bursts that grow the decode batch to each power of two up to its
rows. Before /health turns ready it runs what a first burst of up to READY_ROWS clients meets
(the prompt lengths and the bursts up to that size); the larger bursts, most of the warm-up's
time (480 of its 511 rows at 256), run as idle work (Core.idle_work): one burst per pass of the
engine's loop, only while no request is in the engine and once it has gone a second without a
step, so start-up does not wait for them and a request that arrives waits at most for the burst
under way. A CPU compiles nothing, so
there it does nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import mlx.core as mx

from engine.mlx_boundary import Model
from engine.runner import BatchRunner
from engine.scheduler import Scheduler, SchedulerConfig
from engine.types import Request, SamplingParams

log = logging.getLogger("mlx_serve.engine")

PROMPT_LENGTHS = (16, 37, 64, 100, 128, 200, 256, 512)  # a ladder of prefill shapes
BURST_PROMPT = 64
READY_ROWS = 16  # bursts up to this many rows are warmed before ready; larger ones while idle


def warm_up(
    model: Model, config: SchedulerConfig, vocab_size: int, gpu_only: bool = True
) -> Iterator[None] | None:
    """Runs the warm-up's part before ready now and returns the rest as idle work, one burst per
    next() (None on a CPU, unless gpu_only is off)."""
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
        _run(model, config, unit)
    log.info(
        "warm-up: kernels for %d prompt lengths and batches up to %d rows in %.1f s%s",
        len(sizes),
        max(b for b in bursts if b <= READY_ROWS),
        time.perf_counter() - began,
        f"; up to {bursts[-1]} rows while idle" if later else "",
    )
    return _idle(model, config, later) if later else None


def _idle(model: Model, config: SchedulerConfig, units: list[list[Request]]) -> Iterator[None]:
    took = 0.0
    for unit in units:
        began = time.perf_counter()
        _run(model, config, unit)
        took += time.perf_counter() - began
        yield
    log.info("warm-up while idle: batches up to %d rows in %.1f s", len(units[-1]), took)


def _burst(rows: int, vocab_size: int) -> list[Request]:
    return [_request(f"b{rows}-{i}", BURST_PROMPT + i % 8, vocab_size) for i in range(rows)]


def _request(rid: str, length: int, vocab_size: int) -> Request:
    tokens = tuple(1 + (7 * i) % max(1, min(vocab_size - 1, 1000)) for i in range(length))
    return Request(f"warmup-{rid}", tokens, SamplingParams(), max_tokens=3)


def _run(model: Model, config: SchedulerConfig, requests: list[Request]) -> None:
    """The requests together, as the scheduler admits them, on a runner of their own."""
    runner = BatchRunner(model, prefill_step_size=config.token_budget)
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
