"""How rows that join the batch are prefilled: unevaluated, and (where shapes cost) at a ladder width.

The runner prefills the last chunk of every row that joins in one step together, right-padded to
one width, inside the forward that samples their first tokens (engine.batch.runner's join).
"""

from __future__ import annotations

import mlx.core as mx

from mlx_serve.engine.model.mlx_boundary import PromptProcessingBatch
from mlx_serve.engine.rows.batch_padding import concat_rows


def prefill_width(n: int) -> int:
    """A prompt chunk of n tokens padded to a width on a ladder of four steps an octave (…, 16,
    20, 24, 28, 32, 40, …; powers of two below 16): at most a quarter of a chunk is padding,
    and prompts of any length meet a few dozen widths."""
    if n <= 16:
        return 1 << max(0, n - 1).bit_length()
    step = 1 << (n.bit_length() - 3)
    return -(-n // step) * step


def prompt_lazily(batch: PromptProcessingBatch, tokens: list[list[int]], width: int = 0) -> None:
    """What `batch.prompt(tokens)` computes, for a chunk that fits one forward, left unevaluated.

    mlx-lm's prompt() evaluates each chunk, waiting there for the decode step already queued on
    the accelerator, and then clears MLX's buffer cache, so the steps after it allocate their
    buffers afresh. Unevaluated, the joining rows' prompt goes to the accelerator with their
    first sampled token's forward, queued behind that decode step. The same operations run in
    the same order, so the numerics are prompt()'s. Rows are right-padded to the longest, as
    prompt() pads them, or to `width` when that is longer (the padding is rolled to the left of
    each row's cache by the caches' finalize(), as in prompt(), or trimmed off the end where every
    row has the same: engine.rows.batch_padding).
    """
    for held, more in zip(batch.tokens, tokens):
        held += more
    lengths = [len(t) for t in tokens]
    longest = max(lengths + [width])
    padding = [longest - n for n in lengths]
    padded = max(padding) > 0
    if padded:
        for c in batch.prompt_cache:
            c.prepare(lengths=lengths, right_padding=padding)
    batch.model(mx.array([t + [0] * p for t, p in zip(tokens, padding)]), cache=batch.prompt_cache)
    if padded:
        for c in batch.prompt_cache:
            c.finalize()


def join_batches(batches: list[PromptProcessingBatch]) -> PromptProcessingBatch:
    """The joining rows' prompt batches (one row each, as admitted) as one: the first, extended
    by the others. Each layer's caches are concatenated once (engine.rows.batch_padding.concat_rows)
    where mlx-lm's `extend`, one batch at a time, re-pads and copies the growing batch's caches
    for every row (rows that start from a cached prefix have KV to copy); layers it cannot
    concatenate so are extended as mlx-lm does."""
    merged = batches[0]
    rest = batches[1:]
    if not rest:
        return merged
    layers = [concat_rows([b.prompt_cache[i] for b in batches]) for i in range(len(merged.prompt_cache))]
    if any(layer is None for layer in layers):
        for batch in rest:
            merged.extend(batch)
        return merged
    for batch in rest:
        merged.uids.extend(batch.uids)
        merged.tokens.extend(batch.tokens)
        merged.samplers.extend(batch.samplers)
        merged.logits_processors.extend(batch.logits_processors)
        merged.max_tokens.extend(batch.max_tokens)
        merged.stop_sequences.extend(batch.stop_sequences)
    merged.prompt_cache = layers
    return merged
