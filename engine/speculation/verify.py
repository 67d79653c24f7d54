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

The draft model, when there is one, mirrors the batch's rows in its own batch caches; it
catches up on whatever tokens it has not seen (ragged, right-padded, then cut the same way) and
drafts greedily, all as one lazy graph with the target's verify forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import mlx.core as mx

from engine.lone_row import can_go_plain, to_batched, to_plain
from engine.mlx_boundary import (
    BatchKVCache,
    CacheLayer,
    GenerationBatch,
    KVCache,
    Model,
    greedy_sampler,
    make_prompt_cache,
)
from engine.speculation.cut_cache import cut_rows
from engine.speculation.drafting import Draft


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


class SpecBatch(GenerationBatch):
    """mlx-lm's generation batch plus a speculative step (see the module note), and a lone row's
    plain caches (engine.lone_row): every use but a plain step turns them back into batch caches."""

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


def _plain_cache(model: Model) -> list[KVCache]:
    # A draft model speculates only with plain KV caches (engine.build.load_draft checks).
    return cast("list[KVCache]", make_prompt_cache(model))


__all__ = ["DraftMismatch", "DraftRows", "RowResult", "SpecBatch", "can_speculate", "empty_batch"]
