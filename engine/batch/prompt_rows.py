"""The runner's rows before they decode: each admitted with a prompt batch of its own (the
request's sampler and logits processors fenced, so a fault of theirs fails that row alone) and
prefilled chunk by chunk, alone, until its last chunk joins it to the batch (engine.batch.runner's join);
what a prompt batch has computed is left in the prefix cache.

Apart from engine.batch.runner, whose step is the per-token path. BatchRunner is a PromptRows, so it
calls these as its own methods, with no indirection.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import mlx.core as mx

from mlx_serve.engine.batch.prefix_cache import PrefixStore
from mlx_serve.engine.model.mlx_boundary import (
    CacheLayer,
    LogitsProcessor,
    Model,
    PromptProcessingBatch,
    StopSequences,
    generation_stream,
    greedy_sampler,
    make_prompt_cache,
)
from mlx_serve.engine.rows.quantized_kv import make_quantized_cache
from mlx_serve.engine.rows.row_guard import RowFaults, fenced_processor, fenced_sampler
from mlx_serve.engine.rows.sampling import make_row_processors, make_row_sampler
from mlx_serve.engine.rows.step_records import PrefillChunk
from mlx_serve.engine.types import Request

if TYPE_CHECKING:
    from mlx_serve.engine.speculation.rows import SpeculatingRows

NO_LIMIT = 1 << 40  # the scheduler decides when a row ends, not mlx-lm


class PromptRows:
    """The runner's rows by id (their requests and uids) and, until each joins the batch, its
    own prompt batch. engine.batch.runner.BatchRunner is one, and runs the batch they join."""

    spec: SpeculatingRows  # the runner's (BatchRunner sets it): told of each row admitted

    def __init__(
        self,
        model: Model,
        prefill_step_size: int,
        prefix_cache: PrefixStore | None,
        kv_quantization: tuple[int, int] | None = None,
    ) -> None:
        self.model = model
        self.kv_quantization = kv_quantization  # (bits, group size): rows' KV stored quantized
        self.prefill_step_size = prefill_step_size
        self.prefix_cache = prefix_cache
        self._uids = itertools.count()
        self._uid_of: dict[str, int] = {}
        self._seq_of: dict[int, str] = {}
        self._requests: dict[str, Request] = {}
        self._asks_logprobs: set[str] = set()  # rows whose requests asked for log-probabilities
        self._prompts: dict[str, PromptProcessingBatch] = {}
        self._no_stops = StopSequences()
        self._faults = RowFaults()

    def admit(
        self,
        request: Request,
        cache: list[CacheLayer] | None = None,
        num_cached: int = 0,
        constraint: LogitsProcessor | None = None,
    ) -> None:
        """Queue a row for prefill; `constraint` (its grammar) masks its logits after the rest.
        Nothing is kept when it raises: the row was never admitted."""
        uid = next(self._uids)
        processors = make_row_processors(request.sampling)
        if constraint is not None:
            processors.append(constraint)
        with mx.stream(generation_stream):  # merging a cached prefix's caches: on the step's stream
            prompt = PromptProcessingBatch(
                self.model,
                [uid],
                [cache if cache is not None else self._new_cache()],
                tokens=[list(request.prompt_tokens[:num_cached])],
                prefill_step_size=self.prefill_step_size,
                samplers=[fenced_sampler(make_row_sampler(request.sampling), uid, self._faults)],
                fallback_sampler=greedy_sampler,
                logits_processors=[[fenced_processor(p, uid, self._faults) for p in processors]],
                stop_sequences=[self._no_stops],
                max_tokens=[NO_LIMIT],
            )
        self.spec.admit(request)  # the last step that may raise
        self._uid_of[request.id], self._seq_of[uid] = uid, request.id
        self._requests[request.id] = request
        self._prompts[request.id] = prompt
        if request.logprobs is not None:
            self._asks_logprobs.add(request.id)

    def _new_cache(self) -> list[CacheLayer]:
        if self.kv_quantization is None:
            return make_prompt_cache(self.model)
        bits, group_size = self.kv_quantization
        return make_quantized_cache(self.model, bits, group_size)

    def _prefill(self, chunks: tuple[PrefillChunk, ...]) -> list[tuple[PromptProcessingBatch, list[int]]]:
        """Each row's prompt chunk, alone; the rows whose last chunk this is, to join decoding.
        A row whose chunk raises is recorded as failed and prefills no further."""
        finals: list[tuple[PromptProcessingBatch, list[int]]] = []
        for chunk in chunks:
            request, batch = self._requests[chunk.seq_id], self._prompts[chunk.seq_id]
            tokens = list(request.prompt_tokens[chunk.start : chunk.end])
            try:
                if not chunk.final:
                    batch.prompt([tokens])
                    continue
                if request.share_prompt:
                    tokens = self._leave_prompt(batch, tokens)
            except Exception as exc:  # noqa: BLE001 - recorded and logged: the row fails alone
                self._faults.record(batch.uids[0], exc, "prompt processing")
                continue
            finals.append((batch, tokens))
            del self._prompts[chunk.seq_id]
        return finals

    def _leave_prompt(self, batch: PromptProcessingBatch, tokens: list[int]) -> list[int]:
        """Prefill all but the last prompt token and leave that KV for the sibling choices."""
        if len(tokens) > 1:
            batch.prompt([tokens[:-1]])
        self._keep_prefilled(batch)
        return tokens[-1:]

    def _keep_prefilled(self, prompt: PromptProcessingBatch) -> None:
        """Leave what a row's prompt batch has computed in the prefix cache: for sibling choices
        (above), and for a row that leaves mid-prefill (its client gave up, as Codex does after 5
        minutes without an event), so the same prompt sent again resumes where it stopped."""
        if self.prefix_cache is not None and len(prompt.tokens[0]) > 0:
            self.prefix_cache.store(list(prompt.tokens[0]), prompt.extract_cache(0))
