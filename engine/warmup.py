"""Compiling the usual kernel shapes before the engine reports ready.

MLX's GPU backends compile a kernel the first time it meets a new shape (on CUDA through
NVRTC, cached on disk across restarts; on Metal some kernels are JIT-built too). Unwarmed, the
first requests a server sees pay for it: on the H200 a fresh server's first 16-client burst
waited seconds for its first tokens. So before /health turns ready the engine runs a few
throwaway requests through a runner of its own (no prefix cache: nothing is kept), the way the
scheduler will: prompts of several lengths alone, then bursts that grow the decode batch to
each power of two up to its rows. A CPU compiles nothing, so there it does nothing.
"""

from __future__ import annotations

import logging
import time

import mlx.core as mx

from engine.mlx_boundary import Model
from engine.runner import BatchRunner
from engine.scheduler import Scheduler, SchedulerConfig
from engine.types import Request, SamplingParams

log = logging.getLogger("mlx_serve.engine")

PROMPT_LENGTHS = (16, 37, 64, 100, 128, 200, 256, 512)  # a ladder of prefill shapes
BURST_PROMPT = 64


def warm_up(model: Model, config: SchedulerConfig, vocab_size: int) -> float:
    """Seconds spent compiling (0.0 on a CPU): each prompt length alone, then bursts of rows."""
    if mx.default_device().type != mx.DeviceType.gpu:
        return 0.0
    began = time.perf_counter()
    sizes = [n for n in PROMPT_LENGTHS if n <= config.token_budget]
    for n in sizes:
        _run(model, config, [_request(f"len{n}", n, vocab_size)])
    rows = 1
    while rows <= config.max_running:
        _run(model, config, [_request(f"b{rows}-{i}", BURST_PROMPT + i % 8, vocab_size) for i in range(rows)])
        rows *= 2
    took = time.perf_counter() - began
    log.info(
        "warm-up: kernels for %d prompt lengths and batches up to %d rows in %.1f s",
        len(sizes),
        rows // 2,
        took,
    )
    return took


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
