"""One row's decode step three ways, interleaved round by round: mlx-lm's generate_step, mlx-lm's
GenerationBatch at B=1 over its batch caches (array offsets: one extra add a layer, RoPE with an
array offset), and the same batch over plain KV caches (an int offset, as generate_step has).

    python -m bench.lone_cache --model DIR [--tokens 256] [--rounds 5]

Where a lone stream's decode speed goes between the batch path and the single-stream path.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import GenerationBatch, StopSequences
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

from bench.lone_stream import direct


def batch(model: Any, prompt: list[int], n: int, plain: bool) -> float:
    cache = make_prompt_cache(model)
    model(mx.array(prompt[:-1])[None], cache=cache)
    mx.eval([c.state for c in cache])
    if not plain:
        cache = [BatchKVCache.merge([c]) for c in cache]
    gen = GenerationBatch(
        model,
        [0],
        mx.array(prompt[-1:]),
        cache,
        [list(prompt[:-1])],
        [greedy_sampler],
        greedy_sampler,
        [[]],
        [StopSequences()],
        [1 << 40],
    )
    gen.next()
    start = time.perf_counter()
    for _ in range(n):
        gen.next()
    return n / (time.perf_counter() - start)


def one_stream_args(doc: str | None) -> argparse.Namespace:
    """--model, --tokens and --rounds: what the one-stream benches take."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    return p.parse_args()


def main() -> None:
    args = one_stream_args(__doc__)
    model, tokenizer = load(args.model)
    prompt = tokenizer.encode("Tell me a long story about a lighthouse keeper and the sea. " * 4)
    lanes: dict[str, Callable[[int], float]] = {
        "direct generate_step": lambda n: direct(model, prompt, n + 1),
        "batch B=1, batch caches": lambda n: batch(model, prompt, n, plain=False),
        "batch B=1, plain caches": lambda n: batch(model, prompt, n, plain=True),
    }
    for fn in lanes.values():
        fn(16)
    rates: dict[str, list[float]] = {k: [] for k in lanes}
    for _ in range(args.rounds):
        for name, fn in lanes.items():
            rates[name].append(fn(args.tokens))
    base = rates["direct generate_step"]
    print(f"device {mx.default_device()}  model {args.model}  tokens {args.tokens}  rounds {args.rounds}")
    for name, rs in rates.items():
        ratio = statistics.median(r / b for r, b in zip(rs, base))
        print(
            f"  {name:26s} {statistics.median(rs):8.1f} tok/s  ratio to direct (per round, median) {ratio:.3f}"
            f"  rounds {[round(r, 1) for r in rs]}"
        )


if __name__ == "__main__":
    main()
