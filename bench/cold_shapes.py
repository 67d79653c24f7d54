"""What a new shape costs: the first forward at each batch size and prompt length vs the next.

    python -m bench.cold_shapes --model DIR [--rows 1,2,3,4,8,16,17,32,64] [--lengths 37,64,65,100]

On MLX's CUDA backend the first use of a kernel shape compiles it (NVRTC, cached on disk under
MLX_PTX_CACHE_DIR, default /tmp/mlx/<version>/ptx); point that at an empty folder to see a fresh
machine. Decode: a batch of B rows (mlx-lm batch KV caches, 16 prompt tokens each), the first
step at that B and the median of the next 5. Prefill: one row, a prompt of L tokens, first and
second time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from bench.speculation import load_as_served


def timed(fn: Callable[[], mx.array]) -> float:
    start = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - start


def prefill_once(model: Any, x: mx.array) -> float:
    cache = [BatchKVCache([0]) for _ in range(len(model.layers))]
    return timed(lambda: model(x, cache=cache)[:, -1])


def decode_costs(model: Any, rows: int) -> tuple[float, float, float]:
    layers = len(model.layers)
    cache = [BatchKVCache([0] * rows) for _ in range(layers)]
    prompt = mx.ones((rows, 16), dtype=mx.uint32)
    pre = timed(lambda: model(prompt, cache=cache))
    tok = mx.ones((rows, 1), dtype=mx.uint32)
    steps = [timed(lambda: mx.argmax(model(tok, cache=cache)[:, -1], axis=-1)) for _ in range(6)]
    return pre, steps[0], statistics.median(steps[1:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--rows", default="1,2,3,4,8,16,17,32,64")
    p.add_argument("--lengths", default="37,64,65,100,128")
    args = p.parse_args()
    model = load_as_served(args.model)[0]
    for b in (int(x) for x in args.rows.split(",")):
        pre, first, then = decode_costs(model, b)
        print(
            f"decode B={b:3d}: prefill[{b},16] {pre * 1e3:7.1f} ms  first step {first * 1e3:7.1f} ms  "
            f"then {then * 1e3:6.2f} ms",
            flush=True,
        )
    for n in (int(x) for x in args.lengths.split(",")):
        x = mx.ones((1, n), dtype=mx.uint32)
        costs = [prefill_once(model, x) for _ in range(2)]
        print(
            f"prefill L={n:4d}: first {costs[0] * 1e3:7.1f} ms  second {costs[1] * 1e3:6.1f} ms", flush=True
        )


if __name__ == "__main__":
    main()
