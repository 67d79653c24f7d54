"""What a prompt of a length not seen before costs, against one of a length seen before (a diagnostic).

    python -m bench.prefill_shapes --model DIR [--lengths 200,201,202,203,400,401]

MLX's CUDA backend builds a cuDNN attention graph per query/key shape on first use (set
MLX_CUDA_USE_CUDNN_SDPA=0 to compare without it). For each length this prints the first
prefill of a lone prompt of that length and the median of three more of the same length.
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from engine.model.loader import maybe_dequantize


def prefill_s(model: object, length: int) -> float:
    tokens = mx.random.randint(1000, 20000, (1, length))
    cache = make_prompt_cache(model)
    began = time.perf_counter()
    mx.eval(model(tokens, cache=cache))  # type: ignore[operator]
    return time.perf_counter() - began


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--lengths", default="200,201,202,203,400,401,800,801")
    args = p.parse_args()
    model = maybe_dequantize(load(args.model)[0])
    prefill_s(model, 64)
    print(f"device {mx.default_device()}  model {args.model}")
    for length in (int(x) for x in args.lengths.split(",")):
        first = prefill_s(model, length)
        again = statistics.median(prefill_s(model, length) for _ in range(3))
        print(f"  {length:>6} tokens: first {1000 * first:8.1f} ms, again {1000 * again:8.1f} ms")


if __name__ == "__main__":
    main()
