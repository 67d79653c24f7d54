"""The prefix cache of a model whose layers are all plain KV caches: a store of fixed-size blocks.

NOTE, the algorithm (vLLM's automatic prefix caching, over mlx-lm's contiguous caches). A row's
KV is cut into blocks of `block_tokens` positions; a block is keyed by a hash chained over every
token up to its end (its parent's key and its own tokens), so one key names a whole prefix and
two prompts that share a prefix share its blocks: a 12k-token system prompt is held once however
many conversations start with it. The last block of a row may be partial (fewer tokens); it is
a leaf, dropped once a longer row extends it. A lookup walks the prompt's full blocks by key,
then takes the longest common prefix among the children of the last block found (any length:
plain KV caches can be trimmed), and copies the run into one KV cache per layer for the row
(MLX has no paged attention). Eviction drops blocks one at a time, least recently used first,
and only blocks no cached block descends from (a chain is used from its root to its end, and
is touched end first, so its ancestors are the more recent). With a disk tier
(engine.batch.disk_tier) every full block is also written there, a step after it is stored (its
copy is done by then) or when it is evicted, so a restart finds it; a lookup continues into the
disk tier where memory ends. Where the host cannot read the accelerator's memory in place
(`host_reads_in_place`: a CUDA GPU's managed memory migrates to the host page by page as it is
read, ~1.3 GB/s on an H100, and back on the GPU's next read), writing a block still in use
would slow the next turn that reads it and the decode steps beside the writes, so blocks go to
disk only when they are evicted and, at a clean stop, all of them.

Room: the store's byte limit is the least of --prompt-cache-bytes and the KV memory the running
rows do not hold (`fit`, told each step the slots the scheduler has reserved), so a row that
needs KV memory evicts cache and never waits on it.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import mlx.core as mx

from mlx_serve.engine.batch.prefix_cache import Found, PrefixStats, common_prefix
from mlx_serve.engine.model.mlx_boundary import CacheLayer, KVCache, async_eval, generation_stream
from mlx_serve.engine.types import CacheMiss

if TYPE_CHECKING:
    from mlx_serve.engine.batch.disk_tier import DiskTier

BLOCK_TOKENS = 256
KV_STEP = 256  # mlx-lm's KVCache grows its buffers by this many slots
ROOT_KEY = b"mlx-serve prefix root"
SEEN_KEYS = 1 << 20  # block keys remembered after eviction, to tell an evicted prefix from a cold one


def block_key(parent: bytes, tokens: tuple[int, ...]) -> bytes:
    """A block's key: a hash of its parent's key and its tokens (so of every token before them)."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


@dataclass(slots=True, eq=False)
class Block:
    key: bytes
    parent: Block | None
    tokens: tuple[int, ...]
    keys: list[mx.array]  # per layer, (1, kv heads, len(tokens), head dim)
    values: list[mx.array]
    nbytes: int
    children: dict[bytes, Block] = field(default_factory=dict)

    @property
    def parent_key(self) -> bytes:
        return self.parent.key if self.parent is not None else ROOT_KEY


class BlockStore:
    """One per engine (one model and adapter). Only the engine's owner thread touches it."""

    def __init__(
        self,
        *,
        max_bytes: int,
        min_hit: int = 1,
        block_tokens: int = BLOCK_TOKENS,
        disk: DiskTier | None = None,
        write_through: bool = True,
    ) -> None:
        self.max_bytes = max_bytes
        self.write_through = write_through  # full blocks to disk as stored (else when evicted)
        self.limit_bytes = max_bytes  # max_bytes less what running rows hold (fit)
        self.min_hit = max(1, min_hit)
        self.block_tokens = block_tokens
        self.disk = disk
        self.stats = PrefixStats()
        self._roots: dict[bytes, Block] = {}
        self._lru: OrderedDict[bytes, Block] = OrderedDict()  # least recently used first
        self._seen: OrderedDict[bytes, None] = OrderedDict()  # keys of blocks evicted once
        self._nbytes = 0
        self._unwritten: list[Block] = []  # full blocks stored since the last step, for the disk tier
        self.last: Found = Found(None, 0)

    @property
    def nbytes(self) -> int:
        return self._nbytes

    def __len__(self) -> int:
        return len(self._lru)

    # -- room -------------------------------------------------------------------------

    def fit(self, free_bytes: int) -> None:
        """The KV memory running rows leave free: the store keeps to it (and to max_bytes)."""
        self.limit_bytes = max(0, min(self.max_bytes, free_bytes))
        self._write_through()
        self._evict()

    def _write_through(self) -> None:
        """Blocks stored before this step (their copies evaluated by now) to the disk tier."""
        blocks, self._unwritten = self._unwritten, []
        if self.disk is not None:
            for block in blocks:
                self.disk.put(block.key, block.parent_key, block.tokens, block.keys, block.values, held=True)

    def _evict(self) -> None:
        while self._nbytes > self.limit_bytes and self._lru:
            victim = next((b for b in self._lru.values() if not b.children), None)
            if victim is None:
                return
            self._drop(victim, spill=True)

    def close(self) -> None:
        """Write what the disk tier lacks, and wait for it (a clean stop)."""
        if self.disk is not None:
            self._write_through()
            if not self.write_through:  # the most recently used first (roots before their leaves)
                for block in reversed(list(self._lru.values())):
                    if len(block.tokens) == self.block_tokens:
                        self.disk.put(
                            block.key, block.parent_key, block.tokens, block.keys, block.values, held=True
                        )
            self.disk.close()

    def _drop(self, block: Block, spill: bool) -> None:
        del self._lru[block.key]
        siblings = block.parent.children if block.parent is not None else self._roots
        siblings.pop(block.key, None)
        self._nbytes -= block.nbytes
        full = len(block.tokens) == self.block_tokens
        if full:
            self._seen[block.key] = None
            if len(self._seen) > SEEN_KEYS:
                self._seen.popitem(last=False)
        if spill and full and self.disk is not None:
            self.disk.put(block.key, block.parent_key, block.tokens, block.keys, block.values, held=False)

    def _touch(self, block: Block | None) -> None:
        """A chain's use, end first: its ancestors become the more recent, so leaves go first."""
        while block is not None:
            self._lru.move_to_end(block.key)
            block = block.parent

    # -- lookup -----------------------------------------------------------------------

    def lookup(self, tokens: tuple[int, ...]) -> tuple[list[CacheLayer] | None, int]:
        """A private copy of the longest cached run of the prompt's blocks, and its length; at
        least one prompt token is left to compute (the first sampled token needs its logits).
        The whole answer (disk share, miss kind) stays in `last`."""
        self.stats.lookups += 1
        self._write_through()
        limit = len(tokens) - 1
        run, n, from_disk = self._walk(tuple(tokens), limit)
        miss = self._miss(tuple(tokens), n, limit)
        if n < self.min_hit:
            self.last = Found(None, 0, 0, miss or (CacheMiss.COLD if n == 0 else None))
            return None, 0
        self._touch(run[-1][0])
        self._evict()  # blocks read back from disk take room too
        self.stats.hits += 1
        self.stats.cached_tokens += n
        self.last = Found(_copy(run, len(tokens) - n), n, from_disk, miss)
        return self.last.cache, n

    def _walk(self, tokens: tuple[int, ...], limit: int) -> tuple[list[tuple[Block, int]], int, int]:
        """The cached blocks the prompt starts with (each with the positions used), from memory
        and then from disk; the tokens they hold; how many of those came from disk."""
        b = self.block_tokens
        run: list[tuple[Block, int]] = []
        children, parent, n, from_disk = self._roots, None, 0, 0
        while n + b <= limit:
            key = block_key(parent.key if parent else ROOT_KEY, tokens[n : n + b])
            block = children.get(key)
            if block is None and self.disk is not None:
                block = self._from_disk(key, parent, tokens[n : n + b])
                from_disk += b if block is not None else 0
            if block is None:
                break
            run.append((block, b))
            children, parent, n = block.children, block, n + b
        rest = tokens[n:limit]
        best, m = None, 0
        for child in children.values():
            k = common_prefix(child.tokens, rest)
            if k > m:
                best, m = child, k
        if best is not None:
            run.append((best, m))
        return run, n + m, from_disk

    def _miss(self, tokens: tuple[int, ...], found: int, limit: int) -> CacheMiss | None:
        """EVICTED when the block after those found was once cached; COLD when nothing was."""
        b = self.block_tokens
        key, n = ROOT_KEY, 0
        while n + b <= limit:
            key = block_key(key, tokens[n : n + b])
            n += b
            if n > found:
                return CacheMiss.EVICTED if key in self._seen else (None if found else CacheMiss.COLD)
        return None if found else CacheMiss.COLD

    def _from_disk(self, key: bytes, parent: Block | None, tokens: tuple[int, ...]) -> Block | None:
        assert self.disk is not None
        arrays = self.disk.get(key, parent.key if parent else ROOT_KEY, tokens)
        if arrays is None:
            return None
        keys, values = arrays
        return self._add(key, parent, tokens, keys, values)

    # -- store ------------------------------------------------------------------------

    def store(self, tokens: list[int], cache: list[CacheLayer]) -> None:
        self.store_many([(tokens, cache)])

    def store_many(self, rows: list[tuple[list[int], list[CacheLayer]]]) -> None:
        """Rows' KV, cut into blocks, the blocks not yet held copied out of the rows' buffers in
        one evaluation queued on the accelerator (waiting for it would idle the accelerator
        while the next step is built)."""
        new: list[mx.array] = []
        with mx.stream(generation_stream):
            for tokens, cache in rows:
                if tokens and all(type(c) is KVCache and c.keys is not None for c in cache):
                    new.extend(self._insert(tuple(tokens), cache))
        if new:
            async_eval(new)
        self._evict()

    def _insert(self, tokens: tuple[int, ...], cache: list[CacheLayer]) -> list[mx.array]:
        states = _layers(cache)
        n = min(len(tokens), min(int(k.shape[2]) for k, _ in states))
        b, last, new = self.block_tokens, None, []
        for start in range(0, n, b):
            part = tokens[start : min(n, start + b)]
            block = self._held(last, part)
            if block is None:
                keys = [mx.contiguous(k[..., start : start + len(part), :]) for k, _ in states]
                values = [mx.contiguous(v[..., start : start + len(part), :]) for _, v in states]
                block = self._add(block_key(last.key if last else ROOT_KEY, part), last, part, keys, values)
                new.extend(keys + values)
                if len(part) == b and self.disk is not None and self.write_through:
                    self._unwritten.append(block)
            last = block
        self._touch(last)
        return new

    def _held(self, parent: Block | None, part: tuple[int, ...]) -> Block | None:
        """The block that already holds `part` after `parent` (for a partial part, any block
        that extends it), making room for a new one: partial blocks it extends are dropped."""
        siblings = parent.children if parent else self._roots
        block = siblings.get(block_key(parent.key if parent else ROOT_KEY, part))
        if block is not None:
            return block
        if len(part) < self.block_tokens:
            extends = [s for s in siblings.values() if s.tokens[: len(part)] == part]
            if extends:
                return extends[0]
        for old in [
            s for s in siblings.values() if len(s.tokens) < len(part) and part[: len(s.tokens)] == s.tokens
        ]:
            if not old.children:
                self._drop(old, spill=False)
        return None

    def _add(
        self,
        key: bytes,
        parent: Block | None,
        tokens: tuple[int, ...],
        keys: list[mx.array],
        values: list[mx.array],
    ) -> Block:
        nbytes = sum(a.nbytes for a in keys) + sum(a.nbytes for a in values)
        block = Block(key, parent, tokens, keys, values, nbytes)
        (parent.children if parent else self._roots)[key] = block
        self._lru[key] = block
        self._nbytes += nbytes
        return block


def host_reads_in_place() -> bool:
    """Whether the host reads accelerator arrays where they lie: the CPU's own, or Apple silicon's
    unified memory (MLX's Metal backend). Not a CUDA GPU's managed memory, which migrates."""
    return mx.default_device().type == mx.DeviceType.cpu or mx.metal.is_available()


def _layers(cache: list[CacheLayer]) -> list[tuple[mx.array, mx.array]]:
    out = []
    for c in cache:
        assert isinstance(c, KVCache) and c.keys is not None and c.values is not None
        out.append((c.keys[..., : c.offset, :], c.values[..., : c.offset, :]))
    return out


def _copy(run: list[tuple[Block, int]], room: int) -> list[CacheLayer]:
    """One plain KV cache per layer holding the run's positions, with `room` more slots (rounded
    up to mlx-lm's 256-slot steps) for the rest of the prompt: one copy, where growing the
    cache as the prompt is written would copy all of it again."""
    out: list[CacheLayer] = []
    with mx.stream(generation_stream):
        for layer in range(len(run[0][0].keys)):
            c = KVCache()
            c.keys = _join([b.keys[layer][..., :m, :] for b, m in run], room)
            c.values = _join([b.values[layer][..., :m, :] for b, m in run], room)
            c.offset = sum(m for _, m in run)
            out.append(c)
    return out


def _join(parts: list[mx.array], room: int) -> mx.array:
    if room > 0:
        b, h, _, d = parts[0].shape
        step = KV_STEP
        parts = [*parts, mx.zeros((b, h, -(-room // step) * step, d), parts[0].dtype)]
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)
