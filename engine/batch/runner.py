"""Batched forward passes on MLX, over mlx-lm's prompt and generation batches.

Each admitted sequence is prefilled alone, chunk by chunk, in its own KV cache (so its prompt
numerics are those of a lone request); on its last chunk it joins the running generation
batch, whose caches are mlx-lm's left-padded batch caches (plain KV caches while one row steps
alone: mlx_serve.engine.rows.lone_row). Leaving is a filter of that batch. Admission and the chunks before the
last: mlx_serve.engine.batch.prompt_rows.
mlx-lm's GenerationBatch pipelines: the next step's forward is queued before the current
step's tokens are read, so Python bookkeeping overlaps the accelerator; rows leave without
reading the batch's padding back (mlx_serve.engine.rows.batch_padding), so that overlap holds when they do.
"""

from __future__ import annotations

from typing import cast

import mlx.core as mx

import mlx_serve.engine.rows.batch_padding  # noqa: F401 - batch caches keep their padding on the host too
from mlx_serve.engine.batch.prefix_cache import PrefixStore
from mlx_serve.engine.batch.prompt_rows import PromptRows
from mlx_serve.engine.model.mlx_boundary import Model, PromptProcessingBatch, generation_stream
from mlx_serve.engine.rows.prefill import join_batches, prefill_width, prompt_lazily
from mlx_serve.engine.rows.step_records import StepOutput, StepPlan, TokenLogprobs
from mlx_serve.engine.speculation.drafting import Draft
from mlx_serve.engine.speculation.rows import SpeculatingRows, Speculation
from mlx_serve.engine.speculation.verify import empty_batch


class BatchRunner(PromptRows):
    """Owns the KV caches and the model calls. Called only from the engine's owner thread."""

    def __init__(
        self,
        model: Model,
        *,
        prefill_step_size: int = 2048,
        prefix_cache: PrefixStore | None = None,
        speculation: Speculation | None = None,
        lone_row: bool = True,
        bucket_prefill: bool = False,
        separate_prefill: bool = False,
        kv_quantization: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(model, prefill_step_size, prefix_cache, kv_quantization)
        self.lone_row = lone_row  # a lone row steps on plain KV caches (off: only to bench the difference)
        # Joining rows' prompts padded to prefill_width: for a backend that builds kernels for
        # each new shape (mlx_serve.engine.host.assemble.builds_per_shape)
        self.bucket_prefill = bucket_prefill
        # Joining rows' prefill evaluated on its own, before their first-token forward: a sharded
        # model's collectives must run in the same order on every rank, and one graph holding
        # both forwards does not promise that (a pipeline group's ranks diverged)
        self.separate_prefill = separate_prefill
        self.speculation = speculation or Speculation()
        self.spec = SpeculatingRows(model, self.speculation, prefill_step_size)
        self._gen = empty_batch(model, self.spec.draft_rows)

    def step(self, plan: StepPlan) -> StepOutput:
        with mx.stream(generation_stream):
            self._release(plan.release)
            if not (plan.prefill or plan.decode):  # releases only (Core._step's early release)
                return self._settled(StepOutput({}))
            finals = self._prefill(plan.prefill)
            if finals:
                self._join(finals)
            rows = len(self._gen)
            if rows == 0:
                return self._settled(StepOutput({}))
            allowed = self.spec.allowed(rows, bool(plan.prefill))
            drafts = self.spec.drafts(self._gen, self._seq_of, self._faults) if allowed else None
            if drafts is None:
                if rows == 1 and self.lone_row:
                    self._gen.go_plain()
                sampled = self._gen.step_plain()
                seq_of = self._seq_of
                asked = [(seq_of[u], t, lp) for u, t, lp in sampled] if self._asks_logprobs else []
                out = StepOutput({seq_of[uid]: token for uid, token, _ in sampled}, self._logprobs(asked))
            else:
                out = self._speculate(*drafts)
            # What ran, for the gate: a step it let speculate runs plain when no row has drafts
            # (rows the draft model does not follow, prompt lookups that found nothing).
            self.spec.measure(rows, allowed, drafts is not None, out, clean=not plan.prefill)
            return self._settled(out)

    def alone(self, seq_id: str) -> bool:
        """Whether `seq_id` is the batch's only row and steps plainly: nothing prefilling, no
        speculation, no log-probabilities (what `step_alone` leaves out)."""
        gen = self._gen
        return (
            len(gen.uids) == 1
            and self._seq_of.get(gen.uids[0]) == seq_id
            and not self._prompts
            and not self._asks_logprobs
            and not self.spec.rows
        )

    def step_alone(self) -> int:
        """One plain step of the lone row (`alone` said so): `step` less its plan, drafting
        and output records. A fault of the row's own sampler or processors is left for
        `take_failed`."""
        with mx.stream(generation_stream):
            if self.lone_row:
                self._gen.go_plain()
            return self._gen.step_plain()[0][1]

    def take_failed(self) -> dict[str, str]:
        """The rows whose own part of the last step faulted (why), dropped from the batch now."""
        if not self._faults:
            return {}
        faults = self._faults.take()
        failed = {self._seq_of[uid]: why for uid, why in faults.items() if uid in self._seq_of}
        if failed:
            with mx.stream(generation_stream):
                self._release(tuple(failed), store=False)
        return failed

    def _settled(self, out: StepOutput) -> StepOutput:
        """The step's output less the rows that faulted in it, which leave the batch now."""
        failed = self.take_failed()
        if not failed:
            return out
        return StepOutput(
            {s: t for s, t in out.tokens.items() if s not in failed},
            {s: lp for s, lp in out.logprobs.items() if s not in failed},
            {s: n for s, n in out.speculation.items() if s not in failed},
            failed,
        )

    def _speculate(self, drafts: list[Draft | None], model_k: list[int] | None) -> StepOutput:
        results = self._gen.speculate(drafts, model_k)
        tokens: dict[str, int | tuple[int, ...]] = {}
        spec: dict[str, tuple[int, int]] = {}
        flat: list[tuple[str, int, mx.array]] = []
        for r in results:
            seq_id = self._seq_of[r.uid]
            tokens[seq_id] = tuple(r.tokens)
            flat.extend((seq_id, t, lp) for t, lp in zip(r.tokens, r.logprobs))
            if self.spec.record(seq_id, r.drafted, r.accepted):
                spec[seq_id] = (r.drafted, r.accepted)
        return StepOutput(tokens, self._logprobs(flat), spec)

    def _logprobs(
        self, rows: list[tuple[str, int, mx.array]]
    ) -> dict[str, TokenLogprobs | list[TokenLogprobs]]:
        """The sampled token's log-probability and the top alternatives, for rows that asked.
        A row that emitted several tokens this step gets a list, one entry per token."""
        want = [(s, t, lp) for s, t, lp in rows if self._requests[s].logprobs is not None]
        if not want:
            return {}
        stacked = mx.stack([lp for _, _, lp in want])
        k = max(1, max(self._requests[s].logprobs or 0 for s, _, _ in want))
        top_ids = mx.argpartition(-stacked, k - 1, axis=-1)[:, :k]
        top_lps = mx.take_along_axis(stacked, top_ids, axis=-1)
        chosen = mx.take_along_axis(stacked, mx.array([[t] for _, t, _ in want]), axis=-1)
        mx.eval(top_ids, top_lps, chosen)
        out: dict[str, TokenLogprobs | list[TokenLogprobs]] = {}
        top_id_rows = cast("list[list[int]]", top_ids.tolist())
        top_lp_rows = cast("list[list[float]]", top_lps.tolist())
        chosen_rows = cast("list[list[float]]", chosen.tolist())
        for (seq_id, _, _), ids, lps, lp in zip(want, top_id_rows, top_lp_rows, chosen_rows):
            n = self._requests[seq_id].logprobs or 0
            entry: TokenLogprobs = (lp[0], tuple(sorted(zip(ids, lps), key=lambda p: -p[1])[:n]))
            if seq_id in out:
                prev = out[seq_id]
                out[seq_id] = (prev if isinstance(prev, list) else [prev]) + [entry]
            else:
                out[seq_id] = entry
        return out

    def _join(self, finals: list[tuple[PromptProcessingBatch, list[int]]]) -> None:
        """Last prompt chunks of several sequences in one forward; then they join decoding."""
        merged = join_batches([batch for batch, _ in finals])
        prompts = [list(self._requests[self._seq_of[uid]].prompt_tokens) for uid in merged.uids]
        seq_ids = [self._seq_of[uid] for uid in merged.uids]
        tails = [tokens for _, tokens in finals]
        if any(len(t) > 1 for t in tails):
            heads = [t[:-1] for t in tails]
            width = max(len(h) for h in heads)
            if self.bucket_prefill:
                width = prefill_width(width)
            if len(heads) * width <= self.prefill_step_size:
                prompt_lazily(merged, heads, width)
                if self.separate_prefill:
                    mx.eval([c.state for c in merged.prompt_cache])
            else:
                merged.prompt(heads)
        self._gen.extend(merged.generate([t[-1:] for t in tails]))
        if self.spec.draft_rows is not None:
            rows = len(self._gen)
            self.spec.draft_rows.prefill(prompts, [self.spec.mirrors(s, rows) for s in seq_ids])

    def _release(self, seq_ids: tuple[str, ...], store: bool = True) -> None:
        if not seq_ids:
            return
        gone = {self._uid_of.pop(s) for s in seq_ids if s in self._uid_of}
        if not gone:
            return
        for s in seq_ids:
            prompt = self._prompts.pop(s, None)
            if prompt is not None and store:
                self._keep_prefilled(prompt)
            self._requests.pop(s, None)
            self.spec.forget(s)
            self._asks_logprobs.discard(s)
        for uid in gone:
            self._seq_of.pop(uid, None)
        keep = [i for i, uid in enumerate(self._gen.uids) if uid not in gone]
        if len(keep) == len(self._gen.uids):
            return
        if self.prefix_cache is not None and store:
            self.prefix_cache.store_many(
                [
                    (list(self._gen.tokens[i]), self._gen.extract_cache(i))
                    for i, uid in enumerate(self._gen.uids)
                    if uid in gone
                ]
            )
        self._gen.filter(keep)

    def reset(self) -> None:
        """Forget every row (after a fault): the next request starts from a clean batch."""
        type(self).__init__(
            self,
            self.model,
            prefill_step_size=self.prefill_step_size,
            prefix_cache=self.prefix_cache,
            speculation=self.speculation,
            lone_row=self.lone_row,
            bucket_prefill=self.bucket_prefill,
            separate_prefill=self.separate_prefill,
            kv_quantization=self.kv_quantization,
        )

    @property
    def num_rows(self) -> int:
        return len(self._gen)
