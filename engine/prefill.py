"""How rows that join the batch are prefilled: unevaluated, and (where shapes cost) at a ladder width.

The runner prefills the last chunk of every row that joins in one step together, right-padded to
one width, inside the forward that samples their first tokens (engine.runner's join).
"""

from __future__ import annotations

import mlx.core as mx

from engine.mlx_boundary import PromptProcessingBatch


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
    each row's cache by the caches' finalize(), as in prompt()).
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
