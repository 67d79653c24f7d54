"""A diagnostic for issue 19 item 2: each engine step's phases, timed inside a running server.

    STEP_TRACE_DIR=/tmp/trace PYTHONPATH=bench/step_trace:$PYTHONPATH python -m server ...

Python imports this module at start-up in every process; in the engine's (multiprocessing spawns
it with the server's environment), with STEP_TRACE_DIR set, it wraps the
engine's step and the calls inside it, and every 50 steps (and whenever one row or none is left)
appends those steps to STEP_TRACE_DIR/steps-<pid>.jsonl (a first line says whether phases are
synchronized, then one line a step): per step its start, wall time, decoding rows, rows that
joined, and the wall time of each phase (mlx-lm's batch calls, the prefix cache, MLX's evals).
A lone row's steps (engine.rows.lone_row: one row decoding without a plan) are not traced. Only the
new steps are written, so the tracer's own cost per step stays small and constant (it lands in the next step's "gap").
With STEP_TRACE_SYNC=1 the phases also wait for the accelerator (mx.synchronize) at their end,
so a phase's time is its accelerator time too: pipelining is lost, the split is what it shows.
bench/step_trace_report.py summarizes the files.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from typing import Any

_DIR = os.environ.get("STEP_TRACE_DIR")
# only in the engine process (multiprocessing spawns it with spawn_main): not in the server's
# process, nor in a bench's own process, whose direct mlx-lm runs must not pay for the wrappers
_ENGINE = any("spawn_main" in a for a in getattr(sys, "orig_argv", ()))


def _install(out_dir: str) -> None:
    import mlx.core as mx
    from mlx_lm.generate import GenerationBatch, PromptProcessingBatch

    import engine.batch.core as core_module
    import engine.batch.prefix_cache as prefix_module
    import engine.batch.runner as runner_module
    import engine.batch.scheduler as scheduler_module

    sync = os.environ.get("STEP_TRACE_SYNC") == "1"
    phases: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    steps: list[dict[str, Any]] = []
    last_end = [0.0]
    joined = [0]
    path = os.path.join(out_dir, f"steps-{os.getpid()}.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps({"sync": sync}) + "\n")

    def wrap(owner: Any, name: str, label: str, synced: bool = False) -> None:
        inner = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                out = inner(*args, **kwargs)
                if synced and sync:
                    mx.synchronize()
                return out
            finally:
                phases[label] += time.perf_counter() - t0
                counts[label] += 1

        setattr(owner, name, wrapper)

    wrap(scheduler_module.Scheduler, "schedule", "schedule")
    wrap(scheduler_module.Scheduler, "update", "update")
    wrap(core_module.Core, "_start_guarded", "start")
    wrap(core_module.Core, "_deliver_guarded", "deliver")
    wrap(runner_module.BatchRunner, "_release", "release", synced=True)
    wrap(runner_module.BatchRunner, "_prefill", "prefill_chunks", synced=True)
    wrap(runner_module.BatchRunner, "_join", "join")
    join = runner_module.BatchRunner._join

    def counted_join(self: Any, finals: list[Any]) -> None:
        joined[0] += len(finals)
        join(self, finals)

    runner_module.BatchRunner._join = counted_join  # type: ignore[method-assign]
    wrap(runner_module, "prompt_lazily", "join.prompt_lazily", synced=True)
    wrap(PromptProcessingBatch, "prompt", "prompt", synced=True)
    wrap(PromptProcessingBatch, "generate", "join.generate", synced=True)
    wrap(GenerationBatch, "extend", "join.extend", synced=True)
    wrap(GenerationBatch, "filter", "filter", synced=True)
    wrap(GenerationBatch, "next", "next")
    wrap(prefix_module.PrefixCache, "store", "prefix.store", synced=True)
    wrap(prefix_module.PrefixCache, "lookup", "prefix.lookup")
    wrap(mx, "async_eval", "mx.async_eval")
    wrap(mx, "eval", "mx.eval")
    step = core_module.Core._step

    def traced(self: Any) -> None:
        phases.clear()
        counts.clear()
        joined[0] = 0
        t0 = time.perf_counter()
        before = self.runner.num_rows
        step(self)
        t1 = time.perf_counter()
        steps.append(
            {
                "t": t0,
                "gap": t0 - last_end[0] if last_end[0] else 0.0,
                "wall": t1 - t0,
                "rows": before,
                "after": self.runner.num_rows,
                "joined": joined[0],
                "phases": dict(phases),
                "calls": dict(counts),
            }
        )
        last_end[0] = t1
        # every 50 steps, and when one row or none is left (a lone row's steps are not traced)
        if len(steps) == 50 or self.runner.num_rows <= 1:
            with open(path, "a") as f:
                f.write("".join(json.dumps(s) + "\n" for s in steps))
            steps.clear()

    core_module.Core._step = traced  # type: ignore[method-assign]


if _DIR and _ENGINE:
    try:
        os.makedirs(_DIR, exist_ok=True)
        _install(_DIR)
    except ImportError:  # a process without the engine's imports (a tool, pip): nothing to trace
        pass
