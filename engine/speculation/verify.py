"""Speculative decoding as a property of the continuous batch.

NOTE, the step. Every row of the generation batch has one pending input token (sampled last
step, not yet in the KV cache). A speculative step feeds each row its pending token followed by
its draft tokens — rows without drafts are padded, so rows with and without speculation share
one target forward of width W = 1 + the longest draft. Each row's W positions are sampled with
the row's own processors and sampler; the row accepts its drafts while they equal what the
target sampled (so the accepted text is distributed exactly as the target's), emits the pending
token plus the accepted drafts, and keeps the first target sample it did not accept as its next
pending token. Rejected positions are cut per row from the KV caches (target and draft): what
every row rejected is trimmed, the rest become holes the attention mask hides
(engine.speculation.cut_cache), so every row keeps one shared write position without moving its cache.

The draft model's side of the step (its caches, catching up, drafting) is
engine.speculation.draft_model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import mlx.core as mx

from mlx_serve.engine.model.mlx_boundary import (
    BatchKVCache,
    CacheLayer,
    GenerationBatch,
    KVCache,
    Model,
    greedy_sampler,
    make_prompt_cache,
)
from mlx_serve.engine.rows.lone_row import can_go_plain, to_batched, to_plain
from mlx_serve.engine.speculation.cut_cache import cut_rows
from mlx_serve.engine.speculation.draft_model import DraftRows
from mlx_serve.engine.speculation.drafting import Draft


class DraftMismatch(ValueError):
    """A draft model that cannot serve this target (different tokenizer, unsupported caches)."""


@dataclass(slots=True)
class RowResult:
    uid: int
    tokens: list[int]  # the pending token plus the accepted drafts, in order
    logprobs: list[mx.array]  # each token's distribution (log-probabilities over the vocabulary)
    drafted: int
    accepted: int


def can_speculate(model: Model) -> bool:
    """Speculation cuts KV per row; that needs plain (non-rotating, unquantized) caches."""
    return all(type(c) is KVCache for c in make_prompt_cache(model))


class SpecBatch(GenerationBatch):
    """mlx-lm's generation batch plus a speculative step (see the module note), and a lone row's
    plain caches (engine.rows.lone_row): every use but a plain step turns them back into batch caches."""

    draft_rows: DraftRows | None = None
    known: dict[int, int]  # uid → its pending token, when a speculative step left it concrete
    plain: bool = False  # the one row's caches are plain KV caches

    def go_plain(self) -> None:
        """The batch has one row and steps plainly: step it on plain KV caches where it can."""
        if not self.plain and len(self.uids) == 1 and can_go_plain(self.prompt_cache):
            self.prompt_cache, self.plain = to_plain(self.prompt_cache), True

    def _batched(self) -> None:
        if self.plain:
            self.prompt_cache, self.plain = to_batched(self.prompt_cache), False

    def next(self) -> list[GenerationBatch.Response]:
        self.known = {}
        return super().next()

    def step_plain(self) -> list[tuple[int, int, mx.array]]:
        """One plain step: each row's (uid, token, its distribution), in row order.

        What `next()` samples, without its own ending of rows: mlx-lm counts each row's tokens
        and matches its stop sequences there, and builds a response object a row. The engine's
        rows have neither limit nor stop sequences there (the scheduler ends them), so a step of
        one stream or of many skips that per-row work."""
        self.known = {}
        if not self.uids:
            return []
        tokens, logprobs = self._step()
        return list(zip(self.uids, tokens, logprobs))

    def extend(self, batch: GenerationBatch) -> None:
        self._batched()
        super().extend(batch)

    def extract_cache(self, idx: int) -> list[CacheLayer]:
        self._batched()
        return super().extract_cache(idx)

    def filter(self, keep: list[int]) -> None:
        self._batched()
        super().filter(keep)
        if self.draft_rows is not None:
            self.draft_rows.filter(keep)

    def pending(self, row: int) -> int | None:
        return self.known.get(self.uids[row])

    def speculate(self, drafts: list[Draft | None], draft_k: list[int] | None = None) -> list[RowResult]:
        """One verify step for the whole batch. `drafts[i]` is row i's lookup draft (or None);
        `draft_k[i]` (with a draft model) is how many of the model's drafts row i takes."""
        self._batched()
        pending = self._next_tokens
        assert pending is not None  # a speculative step has rows
        model_k = max(draft_k) if draft_k is not None else 0
        drafter = self.draft_rows if model_k > 0 else None
        model_drafts = drafter.draft(self.tokens, pending, model_k) if drafter is not None else None
        lengths = [len(d.tokens) if d is not None else 0 for d in drafts]
        if draft_k is not None:
            lengths = [max(n, k) for n, k in zip(lengths, draft_k)]
        width = 1 + max(lengths)
        table = mx.array(
            [
                (d.tokens if d is not None else []) + [0] * (width - 1 - (len(d.tokens) if d else 0))
                for d in drafts
            ],
            dtype=mx.uint32,
        )
        if model_drafts is not None:
            use_model = mx.array([d is None or not d.tokens for d in drafts])[:, None]
            md = model_drafts[:, : width - 1]
            if md.shape[1] < width - 1:
                md = mx.pad(md, [(0, 0), (0, width - 1 - md.shape[1])])
            table = mx.where(use_model, md.astype(mx.uint32), table)
        inputs = mx.concatenate([pending.astype(mx.uint32)[:, None], table], axis=1)
        caches = cast("list[BatchKVCache]", self.prompt_cache)  # can_speculate: plain KV caches
        logits = self.model(inputs, cache=caches)
        logits = self._processed(inputs, logits, lengths)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sampled, commits = self._sample(logprobs)
        mx.eval(inputs, sampled, self._next_logprobs)
        fed, got = cast("list[list[int]]", inputs.tolist()), cast("list[list[int]]", sampled.tolist())
        results, cut, accepted_all = [], [], []
        next_tokens, next_logprobs = [], []
        for e, uid in enumerate(self.uids):
            d, n = drafts[e], lengths[e]
            ok = d is None or d.guess is None or d.guess == fed[e][0]
            a = 0
            while ok and a < n and fed[e][1 + a] == got[e][a]:
                a += 1
            emitted = fed[e][: 1 + a]
            if (commit := commits[e]) is not None:
                commit(a + 1)
            results.append(
                RowResult(uid, emitted, [self._next_logprobs[e]] + [logprobs[e, j] for j in range(a)], n, a)
            )
            cut.append(width - 1 - a)
            accepted_all.append(a)
            next_tokens.append(got[e][a])
            next_logprobs.append(logprobs[e, a])
            self.tokens[e].extend(emitted)
            self._num_tokens[e] += len(emitted)
            if self.logits_processors[e]:
                self._token_context[e].update_and_fetch(mx.array(emitted))
        cut_rows(caches, cut)
        if drafter is not None:
            drafter.settle(accepted_all, model_k)
        self._next_tokens = mx.array(next_tokens, dtype=pending.dtype)
        self._next_logprobs = next_logprobs
        self.known = dict(zip(self.uids, next_tokens))
        return results

    def _processed(self, inputs: mx.array, logits: mx.array, lengths: list[int]) -> mx.array:
        """Each row's processors at each position it drafted for, with that position's context.
        A row without drafts is processed at its first position only, exactly as a plain step
        would (a grammar matcher advances once per call: it must see each token once)."""
        if not any(self.logits_processors):
            return logits
        rows = []
        width = inputs.shape[1]
        for e, procs in enumerate(self.logits_processors):
            if not procs:
                rows.append(logits[e])
                continue
            base = self._token_context[e].tokens
            out = []
            for j in range(1 + lengths[e]):
                ctx = mx.concatenate([base, inputs[e, : j + 1].astype(base.dtype)])
                lj = logits[e, j : j + 1]
                for p in procs:
                    lj = p(ctx, lj)
                out.append(lj)
            rows.append(mx.concatenate([*out, logits[e, len(out) : width]], axis=0))
        return mx.stack(rows)

    def _sample(self, logprobs: mx.array) -> tuple[mx.array, list[Callable[[int], None] | None]]:
        samplers = [self.fallback_sampler if s is None else s for s in self.samplers]
        greedy = mx.argmax(logprobs, axis=-1)
        if all(s is greedy_sampler for s in samplers):
            return greedy, [None] * len(samplers)
        rows: list[mx.array] = []
        commits: list[Callable[[int], None] | None] = []
        for e, s in enumerate(samplers):
            if s is greedy_sampler or not hasattr(s, "many"):
                rows.append(greedy[e])
                commits.append(None)
                continue
            many: Callable[[mx.array], tuple[mx.array, Callable[[int], None]]] = s.many  # RowSampler.many
            toks, commit = many(logprobs[e])
            rows.append(toks.astype(greedy.dtype))
            commits.append(commit)
        return mx.stack(rows), commits


def empty_batch(model: Model, draft_rows: DraftRows | None) -> SpecBatch:
    batch = SpecBatch.empty(model, greedy_sampler)
    batch.draft_rows = draft_rows
    batch.known = {}
    return batch


__all__ = ["DraftMismatch", "RowResult", "SpecBatch", "can_speculate", "empty_batch"]
