"""The memory budget across a many-model server's engines, as arithmetic: a model's need from its
files, the share of the budget an engine is given, and which loaded models to unload (least
recently used first, never a busy, pinned or loading one) so a new one fits."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True, slots=True)
class Need:
    """A model's memory need from its files (engine.model.fit): weights, and KV for a context."""

    weights_bytes: int
    kv_bytes_per_token: int
    context: int
    max_position: int | None = None  # the context the model's config allows

    @property
    def nbytes(self) -> int:
        return self.weights_bytes + self.kv_bytes_per_token * self.context


def allot(budget: int, need: int, free: int, models: int) -> int:
    """The budget an engine is given: its need, or an even share of the budget when that is
    more and free (so a second model still fits beside it), never more than is free."""
    return min(free, max(need, budget // max(models, 1)))


@dataclass(frozen=True, slots=True)
class Resident:
    """What eviction knows of a loaded model."""

    name: str
    nbytes: int
    last_used: float
    evictable: bool  # idle, not pinned, not loading


def evictions(residents: Iterable[Resident], free: int, need: int) -> list[str] | None:
    """The least recently used evictable models to unload so `need` bytes are free; [] when they
    already are; None when unloading every evictable model would not free enough."""
    chosen: list[str] = []
    for r in sorted((r for r in residents if r.evictable), key=lambda r: r.last_used):
        if free >= need:
            break
        chosen.append(r.name)
        free += r.nbytes
    return chosen if free >= need else None
