"""Direct mlx-lm baseline, run as its own process so its memory never mixes with a server's.

    python -m bench.direct --model DIR --prompts prompts.json --max-tokens 128 --runs 3 --out out.json

Loads the model with `mlx_lm.load`, applies the chat template to each prompt's messages, and
times `stream_generate` (greedy): warm-up runs first, then timed runs, one prompt each in turn.
`--batch 16,64` also times mlx-lm's `batch_generate` at each B (B prompts from the list, reused
round-robin; one warm-up call at that B first, then `--runs` timed calls).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper


@dataclass(frozen=True, slots=True)
class DirectRun:
    prompt_tokens: int
    prompt_tps: float
    generation_tokens: int
    generation_tps: float
    ttft_s: float
    total_s: float
    peak_memory_gb: float


def timed_run(model: Any, tokenizer: TokenizerWrapper, prompt: list[int], max_tokens: int) -> DirectRun:
    from mlx_lm import stream_generate

    start = time.perf_counter()
    first: float | None = None
    last = None
    for response in stream_generate(model, tokenizer, prompt, max_tokens=max_tokens):
        first = first or time.perf_counter()
        last = response
    if last is None or first is None:
        raise RuntimeError("stream_generate produced nothing")
    return DirectRun(
        prompt_tokens=last.prompt_tokens,
        prompt_tps=last.prompt_tps,
        generation_tokens=last.generation_tokens,
        generation_tps=last.generation_tps,
        ttft_s=first - start,
        total_s=time.perf_counter() - start,
        peak_memory_gb=last.peak_memory,
    )


def run_direct(
    model_dir: Path, prompts: list[list[dict[str, str]]], max_tokens: int, runs: int, warmup: int
) -> dict[str, Any]:
    from mlx_lm import load

    start = time.perf_counter()
    model, tokenizer = load(str(model_dir))[:2]
    load_s = time.perf_counter() - start
    token_lists = [
        list(tokenizer.apply_chat_template(m, add_generation_prompt=True))  # type: ignore[no-untyped-call]
        for m in prompts
    ]
    for i in range(warmup):
        timed_run(model, tokenizer, token_lists[i % len(token_lists)], max_tokens)
    results = [
        timed_run(model, tokenizer, token_lists[(warmup + i) % len(token_lists)], max_tokens)
        for i in range(runs)
    ]
    return {"load_s": load_s, "runs": [asdict(r) for r in results]}


def run_batched(
    model_dir: Path,
    prompts: list[list[dict[str, str]]],
    max_tokens: int,
    runs: int,
    sizes: list[int],
) -> dict[str, Any]:
    """mlx-lm `batch_generate` at each B, warmed at that B first: B prompts in one wave; its
    decode tok/s and its end-to-end rate (prefill included, as a server's aggregate is)."""
    from mlx_lm import batch_generate, load

    model, tokenizer = load(str(model_dir))[:2]
    token_lists = [
        list(tokenizer.apply_chat_template(m, add_generation_prompt=True))  # type: ignore[no-untyped-call]
        for m in prompts
    ]
    out: dict[str, Any] = {}
    for b in sizes:
        batch = [token_lists[i % len(token_lists)] for i in range(b)]
        kwargs: dict[str, Any] = {"completion_batch_size": b, "prefill_batch_size": min(b, 8)}
        batch_generate(model, tokenizer, batch, max_tokens=max_tokens, **kwargs)
        tps = []
        for _ in range(runs):
            start = time.perf_counter()
            stats = batch_generate(model, tokenizer, batch, max_tokens=max_tokens, **kwargs).stats
            tps.append(
                {
                    "generation_tps": stats.generation_tps,
                    "wall_s": time.perf_counter() - start,
                    "generation_tokens": stats.generation_tokens,
                }
            )
        out[str(b)] = tps
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True, help="JSON list of chat message lists")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup-runs", type=int, default=1)
    parser.add_argument("--batch", default="", help="comma-separated B for batch_generate")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    prompts = json.loads(args.prompts.read_text())
    result = run_direct(args.model, prompts, args.max_tokens, args.runs, args.warmup_runs)
    if args.batch:
        sizes = [int(b) for b in args.batch.split(",")]
        result["batch"] = run_batched(args.model, prompts, args.max_tokens, args.runs, sizes)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
