"""One stream's decode through each layer of the engine, interleaved round by round in one process:
direct `stream_generate`, scheduler + runner (bench.lone_stream), and the whole core as the
server builds it (engine.host.assemble.make_core: prefix cache, warm-up, detokenizing, events).

    python -m bench.engine_lanes --model DIR [--tokens 256] [--rounds 5]

Where a lone stream's speed goes between mlx-lm and the engine the server runs (the HTTP hop
itself is bench.single_stream's and the --trace's business).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx

from bench.lone_cache import one_stream_args
from bench.lone_stream import engine
from bench.single_stream import MESSAGES, direct
from engine.batch.core import Core
from engine.batch.core_parts import Ticket
from engine.host.assemble import make_core
from engine.host.settings import EngineSettings
from engine.model.loader import ModelSpec, load_model
from engine.types import Counters, Request, SamplingParams, TextDelta

_ids = itertools.count()


def whole_core(core: Core, prompt: list[int], n: int) -> float:
    """Deltas over time from the first to the last, as the core emits them."""
    times: list[float] = []

    def emit(ev: Any) -> None:
        if isinstance(ev, TextDelta):
            times.append(time.perf_counter())

    ticket = Ticket(Request(f"lane-{next(_ids)}", tuple(prompt), SamplingParams(), n), emit)
    core._accept(ticket)
    while core.scheduler.has_work:
        core._step()
    return (len(times) - 1) / (times[-1] - times[0])


def main() -> None:
    args = one_stream_args(__doc__)
    from engine.model.backend import prefer_shape_free_attention

    prefer_shape_free_attention()  # as the server runs
    loaded = load_model(ModelSpec(Path(args.model), "lanes"))
    core = make_core(loaded, Counters(), EngineSettings())
    model, tokenizer = loaded.model, loaded.tokenizer
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    lanes: dict[str, Callable[[], float]] = {
        "direct": lambda: direct(model, tokenizer, prompt, args.tokens),
        "scheduler+runner": lambda: engine(model, prompt, args.tokens),
        "whole core": lambda: whole_core(core, prompt, args.tokens),
    }
    for fn in lanes.values():
        fn()
    rates: dict[str, list[float]] = {k: [] for k in lanes}
    for _ in range(args.rounds):
        for name, fn in lanes.items():
            rates[name].append(fn())
    print(f"device {mx.default_device()}  model {args.model}  tokens {args.tokens}  rounds {args.rounds}")
    for name, rs in rates.items():
        ratio = statistics.median(r / d for r, d in zip(rs, rates["direct"]))
        print(
            f"  {name:17s} {statistics.median(rs):8.1f} tok/s  {ratio:.3f}x direct (per round)  {[round(r) for r in rs]}"
        )


if __name__ == "__main__":
    main()
