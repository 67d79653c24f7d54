"""One request's generation on the MLX owner thread: prefill, decode, stop, detokenize."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from engine.stops import StopMatcher
from engine.types import (
    Aborted,
    Counters,
    Event,
    Finished,
    FinishReason,
    Request,
    SamplingParams,
    TextDelta,
    Usage,
)


def sampler_for(s: SamplingParams) -> Callable[[mx.array], mx.array]:
    return make_sampler(temp=s.temperature, top_p=s.top_p, min_p=s.min_p, top_k=s.top_k)


def processors_for(s: SamplingParams) -> list[Any]:
    return make_logits_processors(
        logit_bias=s.logit_bias,
        repetition_penalty=s.repetition_penalty or None,
        repetition_context_size=s.repetition_context_size,
        presence_penalty=s.presence_penalty or None,
        presence_context_size=s.presence_context_size,
        frequency_penalty=s.frequency_penalty or None,
        frequency_context_size=s.frequency_context_size,
    )


@dataclass(slots=True)
class SingleStream:
    """Runs requests one at a time on mlx-lm's pipelined generate_step."""

    model: Any
    tokenizer: Any
    counters: Counters
    prefill_step_size: int = 2048

    def run(self, req: Request, is_aborted: Callable[[], bool]) -> Iterator[Event]:
        if req.sampling.seed is not None:
            mx.random.seed(req.sampling.seed)

        def check(_done: int, _total: int) -> None:
            if is_aborted():
                raise Aborted

        steps = generate_step(
            mx.array(req.prompt_tokens),
            self.model,
            max_tokens=req.max_tokens,
            sampler=sampler_for(req.sampling),
            logits_processors=processors_for(req.sampling),
            prompt_cache=make_prompt_cache(self.model),
            prefill_step_size=self.prefill_step_size,
            prompt_progress_callback=check,
        )
        yield from self._decode(req, steps, is_aborted)

    def _decode(self, req: Request, steps: Iterator[tuple[int, Any]],
                is_aborted: Callable[[], bool]) -> Iterator[Event]:
        eos = self.tokenizer.eos_token_ids
        detok = self.tokenizer.detokenizer
        stops = StopMatcher(req.stop)
        n, reason = 0, FinishReason.LENGTH
        self.counters.prompt_tokens += len(req.prompt_tokens)
        for token, _logprobs in steps:
            if is_aborted():
                raise Aborted
            n += 1
            self.counters.generated_tokens += 1
            if token in eos:
                reason = FinishReason.STOP
                break
            detok.add_token(token)
            text = stops.feed(detok.last_segment)
            if text:
                yield TextDelta(text, (token,))
            if stops.matched is not None:
                reason = FinishReason.STOP
                break
        detok.finalize()
        tail = stops.feed(detok.last_segment) + stops.flush()
        if tail:
            yield TextDelta(tail)
        usage = Usage(prompt_tokens=len(req.prompt_tokens), completion_tokens=n)
        yield Finished(reason, usage, stops.matched)
