"""The draft model's KV for every row of the batch, and the greedy drafts it makes.

The draft model, when there is one, mirrors the batch's rows in its own batch caches; it
catches up on whatever tokens it has not seen (ragged, right-padded, then cut the same way) and
drafts greedily, all as one lazy graph with the target's verify forward.

Apart from the verify step (engine.speculation.verify), which only calls `draft` before its
target forward and `settle` after it: this is the draft model's own state.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx

from mlx_serve.engine.model.mlx_boundary import BatchKVCache, KVCache, Model, make_prompt_cache
from mlx_serve.engine.speculation.cut_cache import cut_rows

CATCH_UP = 16  # the widest piece a lagging draft cache catches up by in one forward


class DraftRows:
    """The draft model's KV for every row of the batch, in the batch's row order."""

    def __init__(self, model: Model, prefill_step_size: int) -> None:
        self.model = model
        self.prefill_step_size = prefill_step_size
        self.caches: list[BatchKVCache] = []
        self.seen: list[int] = []  # tokens of each row's history the draft's cache holds
        self.live: list[bool] = []  # rows the draft follows (the others hold a placeholder)
        self._template: list[KVCache] | None = None

    def prefill(self, prompts: list[list[int]], mirror: list[bool] | None = None) -> None:
        """New rows joined the batch with these prompts (their whole prompt is in the target KV).
        A row not mirrored gets a one-token placeholder and is never drafted for."""
        mirror = mirror if mirror is not None else [True] * len(prompts)
        rows: list[list[KVCache]] = []
        for prompt, live in zip(prompts, mirror):
            if not live:
                rows.append(self._placeholder())
                continue
            cache = _plain_cache(self.model)
            for at in range(0, len(prompt), self.prefill_step_size):
                self.model(mx.array(prompt[at : at + self.prefill_step_size])[None], cache=cache)
                mx.eval([c.state for c in cache])
            rows.append(cache)
        merged = [rows[0][i].merge([r[i] for r in rows]) for i in range(len(rows[0]))]
        if not self.caches:
            self.caches = merged
        else:
            for mine, theirs in zip(self.caches, merged):
                mine.extend(theirs)
        self.seen.extend(len(p) for p in prompts)
        self.live.extend(mirror)

    def _placeholder(self) -> list[KVCache]:
        """A one-position cache standing in for a row the draft does not follow (made once;
        merging copies it into the batch caches)."""
        if self._template is None:
            self._template = _plain_cache(self.model)
            self.model(mx.array([[0]]), cache=self._template)
            mx.eval([c.state for c in self._template])
        return self._template

    def filter(self, keep: list[int]) -> None:
        self.seen = [self.seen[i] for i in keep]
        self.live = [self.live[i] for i in keep]
        if not keep:
            self.caches = []
            return
        for c in self.caches:
            c.filter(keep)

    def draft(self, histories: list[list[int]], pending: mx.array, k: int) -> mx.array:
        """k greedy draft tokens per row (B, k), lazily, after each row's history + pending."""
        missing = [h[s:] if live else [] for h, s, live in zip(histories, self.seen, self.live)]
        # Catch up in pieces of at most CATCH_UP tokens, every width a power of two: a lag of any
        # length then reuses a few compiled shapes (a new shape costs a kernel compile on a GPU).
        while max(len(m) for m in missing) >= CATCH_UP:
            piece = [m[:CATCH_UP] for m in missing]
            rows = mx.array([p + [0] * (CATCH_UP - len(p)) for p in piece], dtype=mx.uint32)
            self.model(rows, cache=self.caches)
            cut_rows(self.caches, [CATCH_UP - len(p) for p in piece])
            missing = [m[CATCH_UP:] for m in missing]
        width = 1 << max(len(m) for m in missing).bit_length()
        rows = mx.array([m + [0] * (width - len(m)) for m in missing], dtype=mx.uint32)
        last = mx.array([len(m) for m in missing])
        at_pending = mx.arange(width)[None, :] == last[:, None]
        inputs = mx.where(at_pending, pending.astype(mx.uint32)[:, None], rows)
        logits = self.model(inputs, cache=self.caches)
        picked = mx.take_along_axis(logits, last[:, None, None], axis=1)[:, 0, :]
        cut_rows(self.caches, [width - 1 - len(m) for m in missing])
        self.seen = [len(h) + 1 for h in histories]
        drafts = [mx.argmax(picked, axis=-1)]
        for _ in range(k - 1):
            logits = self.model(drafts[-1][:, None], cache=self.caches)
            drafts.append(mx.argmax(logits[:, -1, :], axis=-1))
        return mx.stack(drafts, axis=1)

    def settle(self, accepted: list[int], k: int) -> None:
        """After verification: keep the pending token and the accepted drafts the draft has fed."""
        kept = [min(a, k - 1) for a in accepted]
        cut_rows(self.caches, [(k - 1) - a for a in kept])
        self.seen = [s + a for s, a in zip(self.seen, kept)]


def _plain_cache(model: Model) -> list[KVCache]:
    # A draft model speculates only with plain KV caches (engine.host.assemble.load_draft checks).
    return cast("list[KVCache]", make_prompt_cache(model))
