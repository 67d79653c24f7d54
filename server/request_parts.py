"""What the app reads of a request apart from its protocol: who asks (principal, betas), its
engine requests one per choice, a parse bounded against deep nesting, and HEAD's bodiless send."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.types import Request
from mlx_serve.protocols.contract import Job, Message, ProtocolContext, Scope, Send
from mlx_serve.server.auth import PRINCIPAL_KEY

T = TypeVar("T")


def principal(scope: Scope) -> str:
    return str(scope.get(PRINCIPAL_KEY, ""))


def betas(scope: Scope) -> frozenset[str]:
    values = [v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"anthropic-beta"]
    return frozenset(b.strip() for v in values for b in v.split(",") if b.strip())


def without_body(send: Send) -> Send:
    """HEAD: the GET answer's status and headers, no body."""

    async def head_send(message: Message) -> None:
        if message["type"] == "http.response.body":
            message = {**message, "body": b""}
        await send(message)

    return head_send


def choices(job: Job) -> list[Request]:
    """One engine request per choice, prompt by prompt (`n` each); the `n` choices of a prompt
    share one prefill of it. Choice i of prompt p is index p * n + i, as OpenAI numbers them."""
    first = job.request
    prompts = (first.prompt_tokens, *job.prompts)
    if len(prompts) == 1 and job.n == 1:
        return [first]
    out: list[Request] = []
    for p, tokens in enumerate(prompts):
        leader = replace(first, id=f"{first.id}-{p * job.n}", prompt_tokens=tokens, share_prompt=job.n > 1)
        out.append(leader)
        for i in range(1, job.n):
            seed = first.sampling.seed
            sampling = replace(first.sampling, seed=None if seed is None else seed + i)
            out.append(
                replace(
                    leader,
                    id=f"{first.id}-{p * job.n + i}",
                    sampling=sampling,
                    share_prompt=False,
                    after=leader.id,
                )
            )
    return out


def nesting_bounded(parse: Callable[[bytes, ProtocolContext], T], body: bytes, ctx: ProtocolContext) -> T:
    """A RecursionError while reading a body comes from the client's nesting (msgspec's
    decoder, or a schema or template walking it): a 400 that says so."""
    try:
        return parse(body, ctx)
    except RecursionError:
        raise InvalidRequest(
            "the request nests arrays and objects too deeply (hundreds of levels) to be read"
        ) from None
