"""The floor under an agent turn's TTFT: direct mlx-lm's prefill of only the turn's new tokens.

One prompt cache follows the session: each turn's prompt is cut back to its common prefix with
the cache, and the rest (the new tokens) is prefilled and timed, through the first token's
logits. Also timed: the whole last prompt from an empty cache (what a server pays without any
cache). Runs in this process before any server starts, and frees the model after.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

PREFILL_STEP = 2048  # mlx-lm's prefill_step_size


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def prefill(model: Any, cache: list[Any], tokens: list[int]) -> None:
    """Run `tokens` into `cache` as mlx-lm's generate does: all but the last in steps that
    evaluate only the cache, then the last token's logits."""
    import mlx.core as mx

    head = tokens[:-1]
    for start in range(0, len(head), PREFILL_STEP):
        model(mx.array(head[start : start + PREFILL_STEP])[None], cache=cache)
        mx.eval([c.state for c in cache])
    mx.eval(model(mx.array(tokens[-1:])[None], cache=cache)[:, -1, :])


def timed_prefill(model: Any, cache: list[Any], tokens: list[int]) -> float:
    began = time.perf_counter()
    prefill(model, cache, tokens)
    return time.perf_counter() - began


def prefill_floor(model_dir: Path, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """Per turn: its templated prompt tokens, its new tokens and their prefill time (s)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    from bench.common import load_as_served

    if not all("messages" in b for b in bodies):
        return {"error": "the floor needs chat bodies (messages)"}
    model, tokenizer = load_as_served(model_dir)
    prompts = [list(tokenizer.apply_chat_template(b["messages"], add_generation_prompt=True)) for b in bodies]
    timed_prefill(model, make_prompt_cache(model), prompts[0][:256])  # compile the shapes once
    cache, held = make_prompt_cache(model), list[int]()
    out: dict[str, Any] = {"prompt_tokens": [], "new_tokens": [], "turn_s": []}
    for prompt in prompts:
        keep = min(common_prefix(held, prompt), len(prompt) - 1)
        trim_prompt_cache(cache, len(held) - keep)
        out["prompt_tokens"].append(len(prompt))
        out["new_tokens"].append(len(prompt) - keep)
        out["turn_s"].append(timed_prefill(model, cache, prompt[keep:]))
        held = prompt
    out["whole_last_s"] = timed_prefill(model, make_prompt_cache(model), prompts[-1])
    del model, cache
    gc.collect()
    mx.clear_cache()
    return out
