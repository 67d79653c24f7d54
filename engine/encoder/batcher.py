"""Which inputs share a forward. Pure Python: inputs that arrived together are sorted by
length and cut into forwards whose padded size (rows × longest row) stays within a token
budget, so short inputs are not padded to a long one's length and no forward grows unbounded."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_FORWARD_TOKENS = 8192
DEFAULT_FORWARD_ROWS = 64


def plan_forwards(
    lengths: Sequence[int], max_tokens: int = DEFAULT_FORWARD_TOKENS, max_rows: int = DEFAULT_FORWARD_ROWS
) -> list[list[int]]:
    """Indices into `lengths`, grouped into forwards, shortest inputs first. A single input longer
    than the budget still gets a forward of its own."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    forwards: list[list[int]] = []
    current: list[int] = []
    for i in order:
        longest = lengths[i]  # sorted: the newcomer is the longest so far
        if current and ((len(current) + 1) * longest > max_tokens or len(current) >= max_rows):
            forwards.append(current)
            current = []
        current.append(i)
    if current:
        forwards.append(current)
    return forwards
