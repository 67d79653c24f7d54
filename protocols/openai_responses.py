"""OpenAI Responses and Open Responses: POST /v1/responses, POST /v1/responses/compact, GET and
DELETE /v1/responses/{id}.

Input items become chat-template messages (`responses_input`): `instructions` and
system/developer items one system message, calls assistant tool calls, their outputs tool
messages, reasoning `reasoning_content`. The body's Structs, `tool_choice` and the answer's
grammar are `responses_request`'s; tools are flattened and checked in `responses_tools`,
answers shaped in `responses_output`. Finished responses are kept in a ResponsesStore, so GET
can return them and `previous_response_id` can continue them; the format owns its store.
Without `max_output_tokens` the answer may run to the context that remains, as the API's do.
Compaction lives in `responses_compact`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import msgspec
import orjson

from mlx_serve.engine.errors import InvalidRequest, ServeError
from mlx_serve.engine.types import Request
from mlx_serve.protocols import conversation as conv
from mlx_serve.protocols import openai_common as common
from mlx_serve.protocols import openai_render as render
from mlx_serve.protocols import reasoning as thinking_control
from mlx_serve.protocols.contract import Job, NotFound, ProtocolContext, Result
from mlx_serve.protocols.responses_compact import COMPACT_DECODER, CompactJob, compact_job, compacted
from mlx_serve.protocols.responses_input import (
    AnyItem,
    InputItem,
    ItemReference,
    as_item,
    input_items,
    template_messages,
)
from mlx_serve.protocols.responses_output import (
    ResponsesJob,
    ResponseStream,
    finished_status,
    output_items,
    response_json,
)
from mlx_serve.protocols.responses_request import (
    RESPONSES_DECODER,
    answer_grammar,
    check_supported,
    echo_settings,
    sampling_params,
    tool_choice,
)
from mlx_serve.protocols.responses_store import ResponsesStore
from mlx_serve.protocols.responses_tools import toolset

__all__ = ["OpenAIResponses", "ResponsesJob", "ResponsesStore", "error_body"]

ID_PREFIX = "resp"
SOCKET_RECENT_BYTES = 64 << 20  # a WebSocket connection's unstored responses, at most
KEEP_REASONING = "reasoning.encrypted_content"


def _own(job: Job) -> ResponsesJob:
    if not isinstance(job, ResponsesJob):
        raise TypeError(f"not a Responses job: {type(job).__name__}")
    return job


def error_body(exc: ServeError) -> bytes:
    return render.error_body(exc)


class OpenAIResponses:
    """The WireFormat of POST /v1/responses, plus compaction and GET/DELETE of stored responses.

    One instance per App: it owns the store that `previous_response_id` reads. A WebSocket
    connection gets its own (`on_socket`): the same store, and the connection's `recent`
    responses, kept whatever their `store` said, as WebSocket mode keeps them in memory.
    """

    def __init__(self, store: ResponsesStore | None = None, recent: ResponsesStore | None = None) -> None:
        self.store = store if store is not None else ResponsesStore()
        self.recent = recent

    def on_socket(self) -> OpenAIResponses:
        """The format for one WebSocket connection: its recent responses live while it does."""
        return OpenAIResponses(
            self.store, ResponsesStore(ttl_s=self.store.ttl_s, max_bytes=SOCKET_RECENT_BYTES)
        )

    def parse(self, body: bytes, ctx: ProtocolContext) -> ResponsesJob:
        """Decode, validate and render one Responses request; ServeError 400/404 on a fault."""
        req = common.decode(RESPONSES_DECODER, body)
        check_supported(req)
        history, new_input = self._conversation(req.previous_response_id, req.input, ctx.principal)
        tools = toolset(req.tools)
        choice = tool_choice(req.tool_choice, tools)
        template = tools.template if choice.mode != "none" else []
        messages = template_messages(req.instructions, history + new_input, tools.model_name, len(history))
        effort = req.reasoning.effort if req.reasoning is not None else None
        kwargs = thinking_control.effort_kwargs(effort)
        constraint = answer_grammar(req, template, choice)
        thinking = thinking_control.thinking_budget(ctx, None, None, "reasoning.effort", effort)
        thinking = thinking.under_grammar(constraint.grammar)
        ids = conv.render_prompt(ctx, messages, template or None, kwargs, "input")
        request = Request(
            id=conv.new_id(ID_PREFIX),
            prompt_tokens=tuple(ids),
            sampling=sampling_params(ctx, req),
            max_tokens=req.max_output_tokens or ctx.room_after(len(ids)),
            tools=tuple(template) or None,
            grammar=constraint.grammar,
            forced_tool_calls=constraint.forced,
            thinking_budget=thinking.tokens,
            thinking_budget_message=thinking.message,
        )
        return ResponsesJob(
            request,
            stream=bool(req.stream),
            model=req.model or ctx.model_id,
            warnings=(
                *tools.warnings,
                *conv.tool_support_warnings(ctx, template),
                *constraint.warnings,
                *thinking_control.effort_warnings(ctx, effort, "reasoning.effort"),
            ),
            echo=echo_settings(req, request, tools),
            history=history,
            new_input=new_input,
            store=req.store is not False,
            tools=tools,
            keep_reasoning=KEEP_REASONING in (req.include or ()),
            owner=ctx.principal,
        )

    def _conversation(
        self, previous_id: str | None, raw: str | list[dict[str, Any]] | None, owner: str
    ) -> tuple[tuple[InputItem, ...], tuple[InputItem, ...]]:
        history = self._history(previous_id, owner)
        new_input = tuple(self._resolved(item, i, owner) for i, item in enumerate(input_items(raw)))
        if not history and not new_input:
            raise InvalidRequest("`input` is required", param="input")
        return history, new_input

    def _history(self, previous_id: str | None, owner: str) -> tuple[InputItem, ...]:
        if previous_id is None:
            return ()
        stored = self.store.get(previous_id, owner)
        if stored is None and self.recent is not None:
            stored = self.recent.get(previous_id, owner)
        if stored is None:
            raise NotFound(
                f"Previous response with id '{previous_id}' not found.", param="previous_response_id"
            )
        return stored.conversation

    def _resolved(self, item: AnyItem, i: int, owner: str) -> InputItem:
        if not isinstance(item, ItemReference):
            return item
        found = self.store.item(item.id, owner)
        if found is None and self.recent is not None:
            found = self.recent.item(item.id, owner)
        if found is None:
            raise NotFound(f"Item with id '{item.id}' not found.", param=f"input[{i}].id")
        return found

    def renderer(self, job: Job, ctx: ProtocolContext) -> ResponseStream:
        return ResponseStream(self.remember, _own(job), ctx)

    def to_json(self, job: Job, results: list[Result], ctx: ProtocolContext) -> bytes:
        own, result = _own(job), results[0]
        output = output_items(own, result)
        status = finished_status(result.finish_reason)
        return self.remember(own, response_json(own, ctx, status, output, result.usage), output)

    def remember(self, job: ResponsesJob, response: dict[str, Any], output: list[dict[str, Any]]) -> bytes:
        """The response's JSON, kept in the store first when the client asked (the default)."""
        body = orjson.dumps(response)
        if job.store or self.recent is not None:
            produced = {item["id"]: as_item(item) for item in output}
            new_items = job.new_input + tuple(produced.values())
            size = len(body) + len(msgspec.json.encode(new_items))
            kept = self.store if job.store else self.recent
            assert kept is not None
            kept.put(job.request.id, body, job.history + new_items, size, produced, job.owner)
        return body

    def error_body(self, exc: ServeError) -> bytes:
        return error_body(exc)

    # -- compaction (POST /v1/responses/compact) -------------------------------------------------

    def compact_job(self, body: bytes, ctx: ProtocolContext) -> CompactJob:
        """The summary's request for a conversation given or stored (see responses_compact)."""
        req = common.decode(COMPACT_DECODER, body)
        history, new_input = self._conversation(req.previous_response_id, req.input, ctx.principal)
        return compact_job(req, history, new_input, ctx)

    def compacted(self, job: CompactJob, result: Result, ctx: ProtocolContext) -> bytes:
        return compacted(job, result, ctx)

    # -- stored responses -------------------------------------------------------------------------

    def retrieve(self, response_id: str, query: bytes = b"", owner: str = "") -> tuple[int, bytes]:
        """GET /v1/responses/{id}: (status, JSON body)."""
        stream = parse_qs(query.decode("latin-1")).get("stream", ["false"])[-1]
        if stream.lower() == "true":
            exc: ServeError = common.unsupported("stream", "streaming a stored response")
            return exc.status, error_body(exc)
        stored = self.store.get(response_id, owner)
        if stored is None:
            return _not_found(response_id)
        return 200, stored.body

    def delete(self, response_id: str, owner: str = "") -> tuple[int, bytes]:
        """DELETE /v1/responses/{id}: (status, JSON body)."""
        if not self.store.delete(response_id, owner):
            return _not_found(response_id)
        return 200, orjson.dumps({"id": response_id, "object": "response.deleted", "deleted": True})


def _not_found(response_id: str) -> tuple[int, bytes]:
    exc = NotFound(f"Response with id '{response_id}' not found.")
    return exc.status, error_body(exc)
