"""Batched forward passes on MLX, over mlx-lm's prompt and generation batches.

Each admitted sequence is prefilled alone, chunk by chunk, in its own KV cache (so its prompt
numerics are those of a lone request); on its last chunk it joins the running generation
batch, whose caches are mlx-lm's left-padded batch caches. Leaving is a filter of that batch.
mlx-lm's GenerationBatch pipelines: the next step's forward is queued before the current
step's tokens are read, so Python bookkeeping overlaps the accelerator.
"""

from __future__ import annotations

import itertools
from typing import Any

import mlx.core as mx
from mlx_lm.generate import GenerationBatch, PromptProcessingBatch, StopSequences, generation_stream
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache
from mlx_lm.sample_utils import greedy_sampler

from engine.prefix_cache import PrefixCache
from engine.sampling import LogitsProcessor, make_row_processors, make_row_sampler
from engine.scheduler import StepOutput, StepPlan
from engine.types import Request

NO_LIMIT = 1 << 40  # the scheduler decides when a row ends, not mlx-lm


def _lone_row_mask(original: Any) -> Any:
    """A batch of one row has no padding, so its one new query attends to every key.

    mlx-lm's single-stream path passes no mask at all then; the batch cache builds a padding
    mask every step anyway. Skipping it gives a lone request the single-stream decode path.
    """

    def make_mask(self: Any, N: int, return_array: bool = False, **kwargs: Any) -> Any:
        if N == 1 and not return_array and self.left_padding.shape[0] == 1:
            return None
        return original(self, N, return_array=return_array, **kwargs)

    return make_mask


if not getattr(BatchKVCache.make_mask, "_mlx_serve", False):
    BatchKVCache.make_mask = _lone_row_mask(BatchKVCache.make_mask)
    BatchKVCache.make_mask._mlx_serve = True  # type: ignore[attr-defined]


class BatchRunner:
    """Owns the KV caches and the model calls. Called only from the engine's owner thread."""

    def __init__(self, model: Any, *, prefill_step_size: int = 2048,
                 prefix_cache: PrefixCache | None = None) -> None:
        self.model = model
        self.prefill_step_size = prefill_step_size
        self.prefix_cache = prefix_cache
        self._uids = itertools.count()
        self._uid_of: dict[str, int] = {}
        self._seq_of: dict[int, str] = {}
        self._requests: dict[str, Request] = {}
        self._prompts: dict[str, PromptProcessingBatch] = {}
        self._gen = GenerationBatch.empty(model, greedy_sampler)
        self._no_stops = StopSequences()

    def admit(self, request: Request, cache: list[Any] | None = None, num_cached: int = 0,
              constraint: LogitsProcessor | None = None) -> None:
        """Queue a row for prefill; `constraint` (its grammar) masks its logits after the rest."""
        uid = next(self._uids)
        self._uid_of[request.id], self._seq_of[uid] = uid, request.id
        self._requests[request.id] = request
        processors = make_row_processors(request.sampling)
        if constraint is not None:
            processors.append(constraint)
        self._prompts[request.id] = PromptProcessingBatch(
            self.model, [uid], [cache if cache is not None else make_prompt_cache(self.model)],
            tokens=[list(request.prompt_tokens[:num_cached])],
            prefill_step_size=self.prefill_step_size,
            samplers=[make_row_sampler(request.sampling)],
            fallback_sampler=greedy_sampler,
            logits_processors=[processors],
            stop_sequences=[self._no_stops], max_tokens=[NO_LIMIT])

    def step(self, plan: StepPlan) -> StepOutput:
        with mx.stream(generation_stream):
            self._release(plan.release)
            finals: list[tuple[PromptProcessingBatch, list[int]]] = []
            for chunk in plan.prefill:
                tokens = list(self._requests[chunk.seq_id].prompt_tokens[chunk.start:chunk.end])
                batch = self._prompts[chunk.seq_id]
                if not chunk.final:
                    batch.prompt([tokens])
                    continue
                if self._requests[chunk.seq_id].share_prompt:
                    tokens = self._leave_prompt(batch, tokens)
                finals.append((batch, tokens))
                del self._prompts[chunk.seq_id]
            if finals:
                self._join(finals)
            if len(self._gen) == 0:
                return StepOutput({})
            responses = self._gen.next()
            tokens = {self._seq_of[r.uid]: r.token for r in responses}
            return StepOutput(tokens, self._logprobs(responses))

    def _logprobs(self, responses: list[Any]) -> dict[str, tuple[float, tuple[tuple[int, float], ...]]]:
        """The sampled token's log-probability and the top alternatives, for rows that asked."""
        want = [(self._seq_of[r.uid], r) for r in responses
                if self._requests[self._seq_of[r.uid]].logprobs is not None]
        if not want:
            return {}
        rows = mx.stack([r.logprobs for _, r in want])
        k = max(1, max(self._requests[s].logprobs or 0 for s, _ in want))
        top_ids = mx.argpartition(-rows, k - 1, axis=-1)[:, :k]
        top_lps = mx.take_along_axis(rows, top_ids, axis=-1)
        chosen = mx.take_along_axis(rows, mx.array([[r.token] for _, r in want]), axis=-1)
        mx.eval(top_ids, top_lps, chosen)
        out = {}
        for (seq_id, _), ids, lps, lp in zip(want, top_ids.tolist(), top_lps.tolist(), chosen.tolist()):
            n = self._requests[seq_id].logprobs or 0
            top = sorted(zip(ids, lps), key=lambda p: -p[1])[:n]
            out[seq_id] = (lp[0], tuple(top))
        return out

    def _join(self, finals: list[tuple[PromptProcessingBatch, list[int]]]) -> None:
        """Last prompt chunks of several sequences in one forward; then they join decoding."""
        merged = finals[0][0]
        for batch, _ in finals[1:]:
            merged.extend(batch)
        self._gen.extend(merged.generate([tokens for _, tokens in finals]))

    def _leave_prompt(self, batch: PromptProcessingBatch, tokens: list[int]) -> list[int]:
        """Prefill all but the last prompt token and leave that KV for the sibling choices."""
        if len(tokens) > 1:
            batch.prompt([tokens[:-1]])
        if self.prefix_cache is not None:
            self.prefix_cache.store(list(batch.tokens[0]), batch.extract_cache(0))
        return tokens[-1:]

    def _release(self, seq_ids: tuple[str, ...]) -> None:
        gone = {self._uid_of.pop(s) for s in seq_ids if s in self._uid_of}
        if not gone:
            return
        for s in seq_ids:
            self._prompts.pop(s, None)
            self._requests.pop(s, None)
        for uid in gone:
            self._seq_of.pop(uid, None)
        keep = [i for i, uid in enumerate(self._gen.uids) if uid not in gone]
        if len(keep) == len(self._gen.uids):
            return
        if self.prefix_cache is not None:
            for i, uid in enumerate(self._gen.uids):
                if uid in gone:
                    self.prefix_cache.store(list(self._gen.tokens[i]), self._gen.extract_cache(i))
        self._gen.filter(keep)

    def reset(self) -> None:
        """Forget every row (after a fault): the next request starts from a clean batch."""
        self.__init__(self.model, prefill_step_size=self.prefill_step_size,  # type: ignore[misc]
                      prefix_cache=self.prefix_cache)

    @property
    def num_rows(self) -> int:
        return len(self._gen)
