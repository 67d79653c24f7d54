"""POST /v1/responses/compact (Open Responses): the model summarises a conversation; the
compacted window is the user's messages, then one `compaction` item holding the summary, which
a later request sends back as input (see responses_input)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import orjson
from msgspec import Struct

from mlx_serve.engine.types import Request
from mlx_serve.protocols import conversation as conv
from mlx_serve.protocols.contract import Job, ProtocolContext, Result
from mlx_serve.protocols.responses_input import InputItem, MessageItem, opaque, template_messages
from mlx_serve.protocols.responses_output import usage_json
from mlx_serve.protocols.responses_tools import Toolset

ID_PREFIX = "resp"
COMPACTION_PROMPT = (
    "Summarise the conversation so far for whoever continues it: the user's goals and requests, "
    "the decisions made, what was learned (files, commands, results), and what remains to do. "
    "Write only the summary."
)


class CompactBody(Struct, frozen=True, kw_only=True):
    """The body of POST /v1/responses/compact: `model` is required, as the specification says."""

    model: str
    input: str | list[dict[str, Any]] | None = None
    previous_response_id: str | None = None
    instructions: str | None = None


COMPACT_DECODER = msgspec.json.Decoder(CompactBody)


@dataclass(frozen=True, slots=True)
class CompactJob(Job):
    """A compaction: the summary's request, and the user messages the compacted window keeps."""

    kept: tuple[str, ...] = ()


def compact_job(
    req: CompactBody, history: tuple[InputItem, ...], new_input: tuple[InputItem, ...], ctx: ProtocolContext
) -> CompactJob:
    """The conversation, then the compaction prompt (`instructions` replace it); a summary is
    meant to be short: at most --max-tokens, within the room left."""
    items = history + new_input
    ask = MessageItem(role="user", content=req.instructions or COMPACTION_PROMPT)
    messages = template_messages(None, (*items, ask), Toolset().model_name, len(history))
    ids = conv.render_prompt(ctx, messages, None, {}, "input")
    request = Request(
        id=conv.new_id(ID_PREFIX),
        prompt_tokens=tuple(ids),
        sampling=conv.sampling(ctx),
        max_tokens=min(ctx.defaults.max_tokens, ctx.room_after(len(ids))),
    )
    kept = tuple(_text(i) for i in items if isinstance(i, MessageItem) and i.role == "user")
    return CompactJob(request, stream=False, model=req.model, kept=kept)


def _text(item: MessageItem) -> str:
    if isinstance(item.content, str):
        return item.content
    return conv.join_text([getattr(p, "text", "") for p in item.content])


def compacted(job: CompactJob, result: Result, ctx: ProtocolContext) -> bytes:
    """The `response.compaction` object: the user's messages, then one compaction item."""
    users = [
        {
            "id": conv.new_id("msg"),
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }
        for text in job.kept
    ]
    summary = {
        "id": conv.new_id("cmp"),
        "type": "compaction",
        "encrypted_content": opaque(result.text.strip()),
    }
    return orjson.dumps(
        {
            "id": job.request.id,
            "object": "response.compaction",
            "output": [*users, summary],
            "created_at": ctx.created,
            "usage": usage_json(result.usage),
        }
    )
