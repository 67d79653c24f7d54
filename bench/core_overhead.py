"""The engine core's own per-token cost, with the model's taken out (issue 19 item 1).

    python -m bench.core_overhead --tokenizer DIR [--tokens 512] [--rounds 7]

On an accelerator one stream's decode is bound by the host thread: building and launching each
step's kernels, and every line of Python around them. To see the Python alone, this runs a model
that costs next to nothing (two layers that only append to their KV caches, logits a one-hot
of a fixed function of the input over a 2,048-token vocabulary) through mlx-lm's
`stream_generate` and through our core (scheduler, batch runner on plain caches, detokenizer,
stop matching, events: `bench.stream_contexts.bare_core`), interleaved by round, and prints the
microseconds per token of each and their difference: what our core adds to every token.
`--tokenizer` is any model folder (only its tokenizer is used).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx import nn
from mlx_lm.tokenizer_utils import load as load_tokenizer

from bench.single_stream import MESSAGES
from bench.stream_contexts import bare_core, core_rate, direct_rate

VOCAB = 2048


class _Layer(nn.Module):
    def __call__(self, x: mx.array, cache: Any) -> mx.array:
        if cache is not None:
            k = mx.zeros((x.shape[0], 1, x.shape[1], 8), dtype=mx.float16)
            cache.update_and_fetch(k, k)
        return x


class NearFreeModel(nn.Module):
    """Token t is followed by (7t + 3) mod 1000 + 100: never an end token, always decodable."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = [_Layer(), _Layer()]

    def __call__(self, inputs: mx.array, cache: Any = None, **_: Any) -> mx.array:
        for layer, c in zip(self.layers, cache or [None] * len(self.layers)):
            inputs = layer(inputs, c)
        nxt = (inputs * 7 + 3) % 1000 + 100
        return (mx.arange(VOCAB)[None, None, :] == nxt[..., None]).astype(mx.float16)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args()
    tokenizer = load_tokenizer(Path(args.tokenizer))
    model = NearFreeModel()
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)

    us: dict[str, list[float]] = {"stream_generate": [], "our core": []}
    for r in range(args.rounds + 2):  # two warm-up rounds
        d, c = (
            direct_rate(model, tokenizer, prompt, args.tokens),
            core_rate(bare_core(model, tokenizer), prompt, args.tokens),
        )
        if r >= 2:
            us["stream_generate"].append(1e6 / d)
            us["our core"].append(1e6 / c)
    print(
        f"near-free model, {args.tokens} tokens, {args.rounds} rounds, interleaved; device {mx.default_device()}"
    )
    for name, xs in us.items():
        print(f"  {name:16s} {statistics.median(xs):7.1f} us/token [{min(xs):.1f}-{max(xs):.1f}]")
    extra = [c - d for c, d in zip(us["our core"], us["stream_generate"])]
    print(f"  our core adds    {statistics.median(extra):7.1f} us/token [{min(extra):.1f}-{max(extra):.1f}]")


if __name__ == "__main__":
    main()
