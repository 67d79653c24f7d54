"""OpenAI Responses and Open Responses: POST /v1/responses, POST /v1/responses/compact, GET and
DELETE /v1/responses/{id}.

Input items become chat-template messages (`responses_input`): `instructions` and
system/developer items one system message, calls assistant tool calls, their outputs tool
messages, reasoning `reasoning_content`. Tools are flattened and checked in `responses_tools`,
answers shaped in `responses_output`. Finished responses are kept in a ResponsesStore, so GET
can return them and `previous_response_id` can continue them; the format owns its store.
Without `max_output_tokens` the answer may run to the context that remains, as the API's do.
Compaction lives in `responses_compact`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

import msgspec
import orjson
from msgspec import Meta, Struct

from engine.errors import InvalidRequest, ServeError
from engine.types import Request, SamplingParams
from protocols import conversation as conv
from protocols import openai_common as common
from protocols import openai_render as render
from protocols import reasoning as thinking_control
from protocols import structured
from protocols.contract import Job, NotFound, ProtocolContext, Result
from protocols.responses_compact import COMPACT_DECODER, CompactJob, compact_job, compacted
from protocols.responses_input import (
    AnyItem,
    InputItem,
    ItemReference,
    as_item,
    input_items,
    template_messages,
)
from protocols.responses_output import (
    ResponsesJob,
    ResponseStream,
    finished_status,
    output_items,
    response_json,
)
from protocols.responses_store import ResponsesStore
from protocols.responses_tools import Toolset, toolset

__all__ = ["OpenAIResponses", "ResponsesJob", "ResponsesStore", "error_body"]

ID_PREFIX = "resp"
SOCKET_RECENT_BYTES = 64 << 20  # a WebSocket connection's unstored responses, at most
KEEP_REASONING = "reasoning.encrypted_content"


class TextFormat(Struct, frozen=True, omit_defaults=True):
    """`text.format`: plain text, any JSON object, or JSON valid against `schema`."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | bool | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(Struct, frozen=True):
    format: TextFormat | None = None
    verbosity: str | None = None  # a hint a local model may not follow


class ReasoningConfig(Struct, frozen=True):
    effort: str | None = None
    summary: str | None = None


class ResponsesBody(Struct, frozen=True, kw_only=True):
    """The body of POST /v1/responses. Unknown fields are ignored, never an error; so are
    `client_metadata` (Codex's) and `prompt_cache_retention`: the prefix cache needs no key."""

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool | None = None
    max_output_tokens: common.PositiveInt | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    presence_penalty: common.Penalty | None = None
    frequency_penalty: common.Penalty | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # Answer-changing fields refused until supported.
    top_logprobs: int | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    context_management: Any = None


_DECODER = msgspec.json.Decoder(ResponsesBody)


@dataclass(frozen=True, slots=True)
class Choice:
    """`tool_choice` resolved against the tools: `none`, `auto` or `required`; the one tool it
    names (by its name in the prompt); the subset `allowed_tools` permits."""

    mode: Literal["none", "auto", "required"] = "auto"
    name: str | None = None
    allowed: tuple[str, ...] | None = None


# --- parse -------------------------------------------------------------------------------------


def _check_supported(req: ResponsesBody) -> None:
    if req.top_logprobs:
        raise common.unsupported("top_logprobs")
    if req.include and "message.output_text.logprobs" in req.include:
        raise common.unsupported("include", "`include` of 'message.output_text.logprobs'")
    if req.background:
        raise common.unsupported("background")
    for name in ("conversation", "prompt", "context_management"):
        if getattr(req, name) is not None:
            raise common.unsupported(name)


def tool_choice(raw: str | dict[str, Any] | None, tools: Toolset) -> Choice:
    """Every form the API takes: a mode, one function or custom tool, or `allowed_tools`."""
    if raw is None or raw in ("none", "auto", "required"):
        return Choice(raw or "auto")  # type: ignore[arg-type]
    if isinstance(raw, str):
        raise InvalidRequest(f"`tool_choice` {raw!r} is not one of none, auto, required", param="tool_choice")
    kind = raw.get("type")
    if kind in ("function", "custom") and isinstance(raw.get("name"), str):
        return Choice("required", _chosen(tools, raw, "tool_choice"))
    if kind == "allowed_tools":
        mode = raw.get("mode", "auto")
        picked = raw.get("tools")
        if mode not in ("auto", "required") or not isinstance(picked, list) or not picked:
            raise InvalidRequest(
                "`allowed_tools` needs `mode` auto or required and a list of `tools`", param="tool_choice"
            )
        names = tuple(_chosen(tools, t, f"tool_choice.tools[{i}]") for i, t in enumerate(picked))
        return Choice(mode, allowed=names)
    raise InvalidRequest(
        f"`tool_choice` of type {kind!r} forces a tool this server does not offer", param="tool_choice.type"
    )


def _chosen(tools: Toolset, raw: Any, param: str) -> str:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise InvalidRequest('a tool choice names its tool: {"type": …, "name": …}', param=param)
    name = tools.model_name(raw["name"], raw.get("namespace"))
    if name not in tools.offered:
        offered = ", ".join(repr(t.name) for t in tools.offered.values())
        raise InvalidRequest(
            f"`{param}` names the tool {raw['name']!r}, which is not among the tools offered ({offered or 'none'})",
            param=param,
        )
    return name


def _grammar(req: ResponsesBody, template: list[dict[str, Any]], choice: Choice) -> structured.Constraint:
    """The grammar the answer follows (a tool choice that constrains calls, else text.format)."""
    parallel = req.parallel_tool_calls is not False
    allowed = [t for t in template if t["function"]["name"] in (choice.allowed or ())]
    if choice.allowed is not None and choice.mode == "auto":
        calls: str | None = structured.allowed_calls(allowed, parallel)
    elif choice.allowed is not None:
        calls = structured.forced_calls(allowed, None, True, parallel)
    else:
        calls = structured.forced_calls(template, choice.name, choice.mode == "required", parallel)
    fmt = req.text.format if req.text is not None else None
    output = None
    if fmt is not None and fmt.type != "text":  # json_object: any object, whatever `schema` says
        schema = fmt.schema if fmt.type == "json_schema" else None
        output = structured.json_schema(schema, "text.format.schema")
    return structured.pick(calls, output, "text.format")


def _effort(reasoning: ReasoningConfig | None) -> str | None:
    return None if reasoning is None else reasoning.effort


def _sampling(ctx: ProtocolContext, req: ResponsesBody) -> SamplingParams:
    sampling = conv.sampling(
        ctx, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p
    )
    return replace(
        sampling, presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0
    )


def _echo(req: ResponsesBody, request: Request, tools: Toolset) -> dict[str, Any]:
    """The request's settings as the response object repeats them, with defaults applied:
    every field Open Responses requires."""
    reasoning = req.reasoning or ReasoningConfig()
    fmt = req.text.format if req.text else None
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": reasoning.effort, "summary": reasoning.summary},
        "service_tier": "default",
        "store": req.store is not False,
        "temperature": request.sampling.temperature,
        "text": {
            "format": msgspec.to_builtins(fmt) if fmt else {"type": "text"},
            "verbosity": (req.text.verbosity if req.text else None) or "medium",
        },
        "tool_choice": req.tool_choice or "auto",
        "tools": tools.echo,
        "top_logprobs": 0,
        "top_p": request.sampling.top_p,
        "presence_penalty": request.sampling.presence_penalty,
        "frequency_penalty": request.sampling.frequency_penalty,
        "truncation": req.truncation or "disabled",
        "user": req.user,
        "safety_identifier": req.safety_identifier,
        "prompt_cache_key": req.prompt_cache_key,
        "metadata": req.metadata or {},
    }


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
        req = common.decode(_DECODER, body)
        _check_supported(req)
        history, new_input = self._conversation(req.previous_response_id, req.input, ctx.principal)
        tools = toolset(req.tools)
        choice = tool_choice(req.tool_choice, tools)
        template = tools.template if choice.mode != "none" else []
        messages = template_messages(req.instructions, history + new_input, tools.model_name, len(history))
        effort = _effort(req.reasoning)
        kwargs = thinking_control.effort_kwargs(effort)
        constraint = _grammar(req, template, choice)
        thinking = thinking_control.thinking_budget(ctx, None, None, "reasoning.effort", effort)
        thinking = thinking.under_grammar(constraint.grammar)
        ids = conv.render_prompt(ctx, messages, template or None, kwargs, "input")
        request = Request(
            id=conv.new_id(ID_PREFIX),
            prompt_tokens=tuple(ids),
            sampling=_sampling(ctx, req),
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
            echo=_echo(req, request, tools),
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
