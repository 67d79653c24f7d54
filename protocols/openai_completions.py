"""OpenAI (legacy) text completions: POST /v1/completions.

The prompt is raw text, encoded as is, or token ids, taken as is after a vocabulary check; a
list of them is several prompts in one call, batched, `n` choices each.

A thinking model's completion is its continuation as written, reasoning and its markers
included (this API has no reasoning channel), and the server's `--reasoning-budget` bounds it
as it does a chat turn's (llama.cpp's `thinking_budget_tokens` / `thinking_budget_message` per
request): past the budget the model's own end-of-thinking is forced into the text and the
answer follows (protocols.reasoning).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any

import msgspec
import orjson
from msgspec import Meta

from mlx_serve.engine.errors import InvalidRequest, ServeError
from mlx_serve.engine.model.tokenizer import ChatTokenizer
from mlx_serve.engine.types import Admitted, Delta, Finished, TextDelta, TokenLogprob
from mlx_serve.protocols import openai_common as common
from mlx_serve.protocols import openai_render as render
from mlx_serve.protocols import reasoning
from mlx_serve.protocols.contract import Frames, Job, ProtocolContext, Result

OBJECT = "text_completion"
ID_PREFIX = "cmpl"
MAX_CHOICES = 128  # prompts × n in one call

Prompt = str | list[str | int | list[int]]


class CompletionBody(common.OpenAIFields, frozen=True, kw_only=True):
    """The body of POST /v1/completions."""

    prompt: Prompt
    # llama.cpp's per-request thinking budget (-1 unbounded, 0 no thinking) and its message.
    thinking_budget_tokens: Annotated[int, Meta(ge=-1)] | None = None
    thinking_budget_message: str | None = None
    # Answer-changing fields refused until supported.
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None


_DECODER = msgspec.json.Decoder(CompletionBody)


def parse_body(body: bytes, ctx: ProtocolContext) -> Job:
    """Decode, validate and tokenize one completions request; ServeError 400 on any fault.
    Several prompts make one call: `n` choices each, numbered prompt by prompt."""
    req = common.decode(_DECODER, body)
    common.check_supported(req, ctx)
    _check_completion_supported(req)
    first, *rest = prompts_of(req.prompt, ctx.tokenizer)
    if (1 + len(rest)) * (req.n or 1) > MAX_CHOICES:
        raise InvalidRequest(
            f"{1 + len(rest)} prompts × n={req.n or 1} is over the {MAX_CHOICES} choices one call may ask",
            param="prompt",
        )
    thinking = reasoning.thinking_budget(
        ctx, req.thinking_budget_tokens, req.thinking_budget_message, "thinking_budget_tokens"
    )
    job = common.build_job(
        req, first, ctx, ID_PREFIX, logprobs=common.completion_logprobs(req), thinking=thinking
    )
    request = replace(job.request, split_reasoning=False)  # the text is the continuation, whole
    return replace(job, request=request, prompts=tuple(map(tuple, rest)))


def _check_completion_supported(req: CompletionBody) -> None:
    if req.best_of is not None and req.best_of > 1:
        raise common.unsupported("best_of", "`best_of` > 1")
    if req.echo:
        raise common.unsupported("echo")
    if req.suffix:
        raise common.unsupported("suffix")


def prompts_of(prompt: Prompt, tokenizer: ChatTokenizer) -> list[list[int]]:
    """Each prompt's token ids: a string, token ids, or a list of strings and token-id lists."""
    if isinstance(prompt, str):
        return [_one(prompt, tokenizer, "prompt")]
    ids = [t for t in prompt if isinstance(t, int)]
    if prompt and len(ids) == len(prompt):
        return [_one(ids, tokenizer, "prompt")]
    if ids:
        raise InvalidRequest("`prompt` mixes token ids with other prompts", param="prompt")
    if not prompt:
        raise InvalidRequest("`prompt` is empty", param="prompt")
    return [_one(p, tokenizer, f"prompt[{i}]") for i, p in enumerate(prompt) if not isinstance(p, int)]


def prompt_tokens(prompt: Prompt, tokenizer: ChatTokenizer) -> list[int]:
    """The token ids of a call with one prompt."""
    return prompts_of(prompt, tokenizer)[0]


def _one(prompt: str | list[int], tokenizer: ChatTokenizer, param: str) -> list[int]:
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt) if prompt else []
    else:
        ids = _checked_ids(prompt, tokenizer.vocab_size, param)
    if not ids:
        raise InvalidRequest(f"`{param}` is empty", param=param)
    return ids


def _checked_ids(ids: list[int], vocab_size: int, param: str = "prompt") -> list[int]:
    for i, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise InvalidRequest(
                f"token id {token} at {param}[{i}] is not in this model's vocabulary (0..{vocab_size - 1})",
                param=param,
            )
    return ids


def _choice(
    text: str, finish_reason: str | None = None, index: int = 0, logprobs: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish_reason}


def _legacy_logprobs(entries: tuple[TokenLogprob, ...], offset: int = 0) -> dict[str, Any]:
    """The completions API's column form: tokens, their log-probabilities, top maps, offsets."""
    offsets, at = [], offset
    for t in entries:
        offsets.append(at)
        at += len(t.token)
    return {
        "tokens": [t.token for t in entries],
        "token_logprobs": [t.logprob for t in entries],
        "top_logprobs": [dict(t.top) for t in entries],
        "text_offset": offsets,
    }


class CompletionStream(render.ChunkStream):
    """text_completion frames: text deltas, then a finish chunk; no primer."""

    def start(self, admitted: Admitted | None = None) -> Frames:
        return []

    def delta(self, event: Delta, index: int = 0) -> Frames:
        if not isinstance(event, TextDelta) or not (event.text or event.logprobs):
            return []
        logprobs = _legacy_logprobs(event.logprobs) if event.logprobs else None
        return [self.frame(_choice(event.text, index=index, logprobs=logprobs))]

    def finish(self, event: Finished, index: int = 0) -> Frames:
        return self.closing(_choice("", event.reason.value, index), event.usage, index)


def completion_json(job: Job, results: list[Result], ctx: ProtocolContext) -> dict[str, Any]:
    want = job.request.logprobs is not None
    choices = [
        _choice(r.text, r.finish_reason.value, i, _legacy_logprobs(r.logprobs) if want else None)
        for i, r in enumerate(results)
    ]
    usage = render.combined_usage([r.usage for r in results], job.n)
    return {**render.response_head(job, ctx, OBJECT), "choices": choices, "usage": render.usage_json(usage)}


class OpenAICompletions:
    """The WireFormat of POST /v1/completions."""

    def parse(self, body: bytes, ctx: ProtocolContext) -> Job:
        return parse_body(body, ctx)

    def renderer(self, job: Job, ctx: ProtocolContext) -> CompletionStream:
        return CompletionStream(render.response_head(job, ctx, OBJECT), job.include_usage, job.n, job.choices)

    def to_json(self, job: Job, results: list[Result], ctx: ProtocolContext) -> bytes:
        return orjson.dumps(completion_json(job, results, ctx))

    def error_body(self, exc: ServeError) -> bytes:
        return render.error_body(exc)


FORMAT = OpenAICompletions()
