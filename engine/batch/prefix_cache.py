"""Reusing the KV of shared prompt prefixes across requests.

A byte- and count-capped store of finished rows' KV, keyed by the tokens it holds, evicting the
least recently stored (as mlx-lm's LRUPromptCache: a lookup does not count as a use, so the ranks
of a sharded group, which look up only what they admit, evict alike); a new request starts from
the longest prefix of its prompt that an entry holds. The store is keyed by model
and adapter (one store per engine), so entries never cross them.

A hit costs little where it pays least: on an accelerator the prefill of a few dozen tokens is
cheap, so a lookup that copied a whole entry (mlx-lm's LRUPromptCache deep-copies the entry
and trims it) or searched every longer entry for the best (its trie's walk) cost a join more
than the hit saved (seen on the H200: 9 ms of lookups and twice the join's first forward per
join step at 64 clients). Here a lookup compares the prompt with each entry in C-level slices,
and the row's cache starts as views of the entry's first n positions (plain KV caches; other
kinds are deep-copied and trimmed, as mlx-lm does), built on the generation stream so the
join's forward does not wait on another stream.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from mlx_serve.engine.model.mlx_boundary import (
    CacheLayer,
    KVCache,
    async_eval,
    can_trim_prompt_cache,
    generation_stream,
    trim_prompt_cache,
)
from mlx_serve.engine.types import CacheMiss


@dataclass(slots=True)
class PrefixStats:
    lookups: int = 0
    hits: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class Found:
    """A lookup's whole answer: the row's cache, the tokens it holds, how many of them came
    from disk, and why it is not longer (None: no more of the prompt was ever cached)."""

    cache: list[CacheLayer] | None
    num_tokens: int
    from_disk: int = 0
    miss: CacheMiss | None = None


@dataclass(slots=True)
class _Entry:
    tokens: tuple[int, ...]
    cache: list[CacheLayer]
    nbytes: int
    trimmable: bool  # a prefix of it can be used (else only the whole of it)


class PrefixStore(Protocol):
    """What the runner and the core use of a prefix cache (PrefixCache, or the block store)."""

    stats: PrefixStats
    last: Found

    def lookup(self, tokens: tuple[int, ...]) -> tuple[list[CacheLayer] | None, int]: ...
    def store(self, tokens: list[int], cache: list[CacheLayer]) -> None: ...
    def store_many(self, rows: list[tuple[list[int], list[CacheLayer]]]) -> None: ...


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """The length of the longest common prefix of a and b (slices compared in C, halving)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixCache:
    """One per engine (one model and adapter). Only the engine's owner thread touches it."""

    def __init__(self, *, max_entries: int, max_bytes: int, min_hit: int = 1) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.min_hit = max(1, min_hit)  # a shorter common prefix is computed again (see gpu_min_hit)
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()  # least recent first
        self._nbytes = 0
        self.stats = PrefixStats()
        self.last = Found(None, 0)  # the last lookup's whole answer

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, tokens: tuple[int, ...]) -> tuple[list[CacheLayer] | None, int]:
        """A private copy of the longest usable cached prefix, and how many tokens it holds.

        At least one prompt token is always left to compute, since the first sampled token
        needs the logits of the last prompt position.
        """
        self.stats.lookups += 1
        tokens = tuple(tokens)
        best: _Entry | None = None
        n = 0
        for entry in self._entries.values():
            m = min(common_prefix(entry.tokens, tokens), len(tokens) - 1)
            if m < len(entry.tokens) and not entry.trimmable:
                continue  # only the whole of it is usable, and not all of it is a prefix here
            if m > n:
                best, n = entry, m
        if best is None or n < self.min_hit:
            self.last = Found(None, 0, 0, CacheMiss.COLD if n == 0 else None)
            return None, 0
        self.stats.hits += 1
        self.stats.cached_tokens += n
        self.last = Found(_prefix_of(best, n), n)
        return self.last.cache, n

    def store(self, tokens: list[int], cache: list[CacheLayer]) -> None:
        self.store_many([(tokens, cache)])

    def store_many(self, rows: list[tuple[list[int], list[CacheLayer]]]) -> None:
        """Rows' KV, kept in one evaluation: detached from the batch's buffers by the
        accelerator in queue order (waiting for it here would idle the accelerator while the
        next step is built), and queued as one task, not one a row (MLX waits for queued tasks
        once there are many)."""
        rows = [(t, c) for t, c in rows if t and self.max_entries > 0]
        if rows:
            async_eval([[c.state for c in cache] for _, cache in rows])
        for tokens, cache in rows:
            self._insert(tokens, cache)

    def _insert(self, tokens: list[int], cache: list[CacheLayer]) -> None:
        key = tuple(tokens)
        entry = _Entry(
            key, cache, sum(int(getattr(c, "nbytes", 0)) for c in cache), can_trim_prompt_cache(cache)
        )
        self._drop(key)
        if entry.trimmable:  # entries it extends serve no lookup it does not serve as well
            for old in [k for k in self._entries if len(k) < len(key) and key[: len(k)] == k]:
                self._drop(old)
        self._entries[key] = entry
        self._nbytes += entry.nbytes
        while self._entries and (len(self._entries) > self.max_entries or self._nbytes > self.max_bytes):
            self._drop(next(iter(self._entries)))

    def _drop(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._nbytes -= entry.nbytes


def gpu_min_hit(gpu: bool) -> int:
    """The shortest cached prefix worth a hit. On an accelerator a hit costs a copy and a merge
    of every layer's KV into the joining batch (kernels by the hundred for a join of several
    rows), while the prefill it saves of a chat template's shared opening (a few dozen tokens)
    is nearly free: on the H200 (1B, 64 clients, prompts sharing a 30-token opening) such hits
    made every step where rows joined twice as long. A CPU pays for every prefilled token."""
    return MIN_GPU_HIT if gpu else 1


MIN_GPU_HIT = 128


def _prefix_of(entry: _Entry, n: int) -> list[CacheLayer]:
    """A cache holding the entry's first n positions, that the row can write past freely.

    Plain KV caches become views of the entry's buffers (the row's first write grows them into
    buffers of its own); other kinds are deep-copied and trimmed."""
    with mx.stream(generation_stream):
        if all(type(c) is KVCache and c.keys is not None for c in entry.cache):
            out: list[CacheLayer] = []
            for c in entry.cache:
                assert isinstance(c, KVCache) and c.keys is not None and c.values is not None
                view = KVCache()
                view.keys, view.values, view.offset = c.keys[..., :n, :], c.values[..., :n, :], n
                out.append(view)
            return out
        cache = copy.deepcopy(entry.cache)
        if n < len(entry.tokens):
            trim_prompt_cache(cache, len(entry.tokens) - n)
        return cache
