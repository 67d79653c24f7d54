"""Reusing the KV of shared prompt prefixes across requests.

A byte- and count-capped LRU over mlx-lm's prompt trie (`LRUPromptCache`): finished rows
leave their KV keyed by the tokens it holds; a new request starts from the longest cached
prefix of its prompt. The key includes the model and adapter, so entries never cross them.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.mlx_boundary import (
    CacheLayer,
    LRUPromptCache,
    async_eval,
    can_trim_prompt_cache,
    trim_prompt_cache,
)


@dataclass(slots=True)
class PrefixStats:
    lookups: int = 0
    hits: int = 0
    cached_tokens: int = 0


class PrefixCache:
    """Only the engine's owner thread touches it."""

    def __init__(self, model_key: str, *, max_entries: int, max_bytes: int) -> None:
        self.model_key = model_key
        self._lru = LRUPromptCache(max_size=max_entries, max_bytes=max_bytes)
        self.stats = PrefixStats()

    @property
    def nbytes(self) -> int:
        return int(self._lru.nbytes)

    def __len__(self) -> int:
        return len(self._lru)

    def lookup(self, tokens: tuple[int, ...]) -> tuple[list[CacheLayer] | None, int]:
        """A private copy of the longest usable cached prefix, and how many tokens it holds.

        At least one prompt token is always left to compute, since the first sampled token
        needs the logits of the last prompt position.
        """
        self.stats.lookups += 1
        cache, rest = self._lru.fetch_nearest_cache(self.model_key, list(tokens))
        if cache is None:
            return None, 0
        n = len(tokens) - len(rest)
        if n >= len(tokens):
            if not can_trim_prompt_cache(cache):
                return None, 0
            n -= trim_prompt_cache(cache, n - len(tokens) + 1)
        if n <= 0:
            return None, 0
        self.stats.hits += 1
        self.stats.cached_tokens += n
        return cache, n

    def store(self, tokens: list[int], cache: list[CacheLayer]) -> None:
        if not tokens:
            return
        # Detached from the batch's buffers by the accelerator in queue order: waiting for it
        # here would idle the accelerator while the next step is built.
        async_eval([c.state for c in cache])
        self._lru.insert_cache(self.model_key, list(tokens), cache)
