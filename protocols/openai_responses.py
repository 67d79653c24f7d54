"""OpenAI Responses: POST /v1/responses, GET and DELETE /v1/responses/{id}.

Input items become chat-template messages (see `conversation`): `instructions` and
system/developer items one system message, function_call items assistant tool calls,
function_call_output items tool messages, reasoning items `reasoning_content`. Finished
responses are kept in a ResponsesStore, so GET can return them and `previous_response_id`
can continue their conversation; the format owns its store.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal
from urllib.parse import parse_qs

import msgspec
import orjson
from msgspec import Meta, Struct

from engine.errors import InvalidRequest, QueueFull, ServeError
from engine.types import (
    Delta,
    Finished,
    FinishReason,
    ReasoningDelta,
    Request,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from protocols import conversation as conv
from protocols import openai_common as common
from protocols import structured
from protocols.contract import KEEP_ALIVE, Frame, Frames, Job, NotFound, ProtocolContext, Result, SseEvent
from protocols.conversation import TemplateConversation

ID_PREFIX = "resp"
MIB = 1 << 20


# --- request -----------------------------------------------------------------------------------


class _Part(Struct, frozen=True, tag_field="type"):
    """A content part; media kinds carry nothing we read, they are refused by kind."""


class InputText(_Part, frozen=True, tag="input_text"):
    text: str


class OutputText(_Part, frozen=True, tag="output_text"):
    text: str


class Refusal(_Part, frozen=True, tag="refusal"):
    refusal: str


class InputImage(_Part, frozen=True, tag="input_image"):
    pass


class InputFile(_Part, frozen=True, tag="input_file"):
    pass


class InputAudio(_Part, frozen=True, tag="input_audio"):
    pass


Part = InputText | OutputText | Refusal | InputImage | InputFile | InputAudio
_MEDIA_INPUT: dict[type[_Part], str] = {InputImage: "vision", InputFile: "file", InputAudio: "audio"}


class _Item(Struct, frozen=True, tag_field="type"):
    """An input item; `type` defaults to "message" as the API allows."""


class MessageItem(_Item, frozen=True, tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]


class FunctionCallItem(_Item, frozen=True, tag="function_call"):
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Item, frozen=True, tag="function_call_output"):
    output: str | list[Part]
    call_id: str | None = None


class ReasoningText(Struct, frozen=True):
    text: str


class ReasoningItem(_Item, frozen=True, tag="reasoning"):
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


class FunctionTool(Struct, frozen=True, kw_only=True):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    # Accepted; arguments follow the schema when `tool_choice` forces a call (as in chat).
    strict: bool | None = None


class FunctionChoice(Struct, frozen=True):
    """`{"type": "function", "name": …}`: a call to that function, and only it."""

    name: str
    type: Literal["function"] = "function"


class TextFormat(Struct, frozen=True, omit_defaults=True):
    """`text.format`: plain text, any JSON object, or JSON valid against `schema`."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | bool | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(Struct, frozen=True):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningConfig(Struct, frozen=True):
    effort: str | None = None
    summary: str | None = None


class ResponsesBody(Struct, frozen=True, kw_only=True):
    """The body of POST /v1/responses. Unknown fields are ignored, never an error."""

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
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    # Answer-changing fields refused until supported.
    top_logprobs: int | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    context_management: Any = None


_DECODER = msgspec.json.Decoder(ResponsesBody)


@dataclass(frozen=True, slots=True)
class ResponsesJob(Job):
    """A Responses call: what the response object repeats, and the conversation to store."""

    echo: dict[str, Any] = field(default_factory=dict)
    history: tuple[InputItem, ...] = ()
    new_input: tuple[InputItem, ...] = ()
    store: bool = True


# --- the store ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: bytes
    conversation: tuple[InputItem, ...]
    size: int
    expires_at: float


class ResponsesStore:
    """Finished responses by id, for GET and `previous_response_id`; event-loop only.

    Entries live `ttl_s` seconds; past `max_bytes` in all, the oldest go first. A conversation
    shares its earlier items with the response it continues, so `size` counts what is new.
    """

    def __init__(
        self, ttl_s: float = 3600.0, max_bytes: int = 256 * MIB, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self.bytes_used = 0

    def put(self, response_id: str, body: bytes, conversation: tuple[InputItem, ...], size: int) -> None:
        if size > self.max_bytes:
            return
        self.delete(response_id)
        self._entries[response_id] = StoredResponse(body, conversation, size, self._clock() + self.ttl_s)
        self.bytes_used += size
        self._evict()

    def get(self, response_id: str) -> StoredResponse | None:
        self._evict()
        return self._entries.get(response_id)

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self.bytes_used -= entry.size
        return entry is not None

    def __len__(self) -> int:
        return len(self._entries)

    def _evict(self) -> None:
        now = self._clock()
        while self._entries:
            oldest_id, oldest = next(iter(self._entries.items()))
            if oldest.expires_at > now and self.bytes_used <= self.max_bytes:
                return
            self.delete(oldest_id)


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


def input_items(raw: str | list[dict[str, Any]] | None) -> tuple[InputItem, ...]:
    """`input` as typed items: a string is one user message."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (MessageItem(role="user", content=raw),)
    return tuple(_item(one, f"input[{i}]") for i, one in enumerate(raw))


def _item(raw: dict[str, Any], path: str) -> InputItem:
    try:
        return as_item({"type": "message", **raw})
    except msgspec.ValidationError as exc:
        message = str(exc)
        at = f"`$.{path}"
        message = message.replace("`$", at) if " - at `$" in message else f"{message} - at {at}`"
        raise InvalidRequest(f"invalid request: {message}", param=common.error_param(message)) from exc


def as_item(raw: dict[str, Any]) -> InputItem:
    item: InputItem = msgspec.convert(raw, InputItem)
    return item


def template_messages(
    instructions: str | None, items: tuple[InputItem, ...], first_new: int = 0
) -> list[dict[str, Any]]:
    """Instructions plus the conversation as chat-template message dicts."""
    turns = TemplateConversation()
    if instructions:
        turns.system(instructions)
    for i, item in enumerate(items):
        _add_item(turns, item, f"input[{i - first_new}]", stored=i < first_new)
    return turns.messages()


def _add_item(turns: TemplateConversation, item: InputItem, path: str, stored: bool) -> None:
    if isinstance(item, MessageItem):
        text = _text(item.content, f"{path}.content")
        add = {"user": turns.user, "assistant": turns.assistant}.get(item.role, turns.system)
        add(text)
    elif isinstance(item, FunctionCallItem):
        turns.tool_call(item.call_id, item.name, _arguments(item.arguments, path, stored))
    elif isinstance(item, FunctionCallOutputItem):
        turns.tool_result(item.call_id, _text(item.output, f"{path}.output"))
    else:
        thought = conv.join_text([p.text for p in item.content or item.summary])
        if thought:
            turns.reasoning(thought)


def _arguments(raw: str, path: str, stored: bool) -> Any:
    try:
        return conv.parse_arguments(raw, f"{path}.arguments")
    except InvalidRequest:
        if stored:  # a stored call of our own, cut short by max_output_tokens: keep its text
            return raw
        raise


def _text(content: str | list[Part], path: str) -> str:
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, InputText | OutputText):
            texts.append(part.text)
        elif isinstance(part, Refusal):
            texts.append(part.refusal)
        else:
            kind = _MEDIA_INPUT[type(part)]
            raise InvalidRequest(f"this model has no {kind} input", param=f"{path}[{j}]")
    return conv.join_text(texts)


def _template_tools(req: ResponsesBody) -> list[dict[str, Any]] | None:
    if not req.tools or req.tool_choice == "none":
        return None
    out = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise InvalidRequest(
                f"tool type {tool.type!r} is not supported: only function tools", param=f"tools[{i}].type"
            )
        if tool.name is None:
            raise InvalidRequest("a function tool needs a `name`", param=f"tools[{i}].name")
        out.append(conv.function_tool(tool.name, tool.description, tool.parameters))
    return out


def _grammar(req: ResponsesBody, tools: list[dict[str, Any]] | None) -> tuple[str | None, bool]:
    """The grammar the answer follows (text.format or a forced tool choice), and whether it
    forces tool calls."""
    choice = req.tool_choice
    name = choice.name if isinstance(choice, FunctionChoice) else None
    forced = structured.forced_calls(tools, name, choice == "required", req.parallel_tool_calls is not False)
    fmt = req.text.format if req.text is not None else None
    output = None
    if fmt is not None and fmt.type != "text":  # json_object: any object, whatever `schema` says
        schema = fmt.schema if fmt.type == "json_schema" else None
        output = structured.json_schema(schema, "text.format.schema")
    return structured.pick(forced, output, "text.format")


def _thinking(reasoning: ReasoningConfig | None) -> bool | None:
    if reasoning is None or reasoning.effort is None:
        return None
    return reasoning.effort != "none"


def _echo(req: ResponsesBody, request: Request) -> dict[str, Any]:
    """The request's settings as the response object repeats them, with defaults applied."""
    reasoning = req.reasoning or ReasoningConfig()
    fmt = req.text.format if req.text else None
    tools = [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
            "strict": t.strict,
        }
        for t in req.tools or ()
    ]
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
        "tool_choice": msgspec.to_builtins(req.tool_choice or "auto"),
        "tools": tools,
        "top_logprobs": 0,
        "top_p": request.sampling.top_p,
        "truncation": req.truncation or "disabled",
        "user": req.user,
        "metadata": req.metadata or {},
    }


# --- answers -----------------------------------------------------------------------------------


def usage_json(usage: Usage) -> dict[str, Any]:
    # The engine's Usage gains reasoning_tokens with reasoning support; until then it is 0.
    reasoning_tokens = int(getattr(usage, "reasoning_tokens", 0))
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.total_tokens,
        **common.speculation_json(usage),
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def message_item(item_id: str, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [text_part(text)]
    return {"id": item_id, "type": "message", "status": status, "content": content, "role": "assistant"}


def reasoning_item(item_id: str, status: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"id": item_id, "type": "reasoning", "summary": [], "content": content, "status": status}


def call_item(item_id: str, status: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }


def output_items(result: Result) -> list[dict[str, Any]]:
    """A whole answer's items; the last is "incomplete" when max_output_tokens cut it."""
    out: list[dict[str, Any]] = []
    if result.reasoning:
        out.append(reasoning_item(conv.new_id("rs"), "completed", result.reasoning))
    if result.text:
        out.append(message_item(conv.new_id("msg"), "completed", result.text))
    out += [call_item(conv.new_id("fc"), "completed", c.id, c.name, c.arguments) for c in result.tool_calls]
    if out and result.finish_reason is FinishReason.LENGTH:
        out[-1]["status"] = "incomplete"
    return out


def response_json(
    job: ResponsesJob,
    ctx: ProtocolContext,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": job.request.id,
        "object": "response",
        "created_at": ctx.created,
        "status": status,
        "background": False,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": error,
        "incomplete_details": incomplete,
        "model": job.model,
        "output": output,
        **job.echo,
        "usage": None if usage is None else usage_json(usage),
    }


def finished_status(reason: FinishReason) -> str:
    return "incomplete" if reason is FinishReason.LENGTH else "completed"


def failure_json(exc: ServeError) -> dict[str, Any]:
    """A failed response's `error`, with the codes the API uses there."""
    if isinstance(exc, QueueFull):
        code = "rate_limit_exceeded"
    elif isinstance(exc, InvalidRequest):
        code = "invalid_prompt"
    else:
        code = "server_error"
    error = common.error_json(exc)["error"]
    return {"code": code, "message": exc.message, "param": exc.param, "type": error["type"]}


def _conversation_items(output: list[dict[str, Any]]) -> tuple[InputItem, ...]:
    return tuple(as_item(item) for item in output)


@dataclass(slots=True)
class _OpenItem:
    kind: str
    item_id: str
    pieces: list[str] = field(default_factory=list)
    call_index: int = -1
    call_id: str = ""
    name: str = ""


class ResponseStream:
    """The Responses event chain with sequence numbers: response.created, .in_progress, then
    per output item added / (content part added, deltas, done) / done, and a terminal
    response.completed, .incomplete or .failed. Items arrive one after another.
    """

    def __init__(self, fmt: OpenAIResponses, job: ResponsesJob, ctx: ProtocolContext) -> None:
        self._fmt = fmt
        self._job = job
        self._ctx = ctx
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        self._open: _OpenItem | None = None

    def _emit(self, kind: str, **payload: Any) -> SseEvent:
        event = SseEvent({"type": kind, **payload, "sequence_number": self._seq}, kind)
        self._seq += 1
        return event

    def _at(self, item: _OpenItem) -> dict[str, Any]:
        return {"item_id": item.item_id, "output_index": len(self._output)}

    def start(self) -> Frames:
        response = response_json(self._job, self._ctx, "in_progress", [])
        return [
            self._emit("response.created", response=response),
            self._emit("response.in_progress", response=response),
        ]

    def delta(self, event: Delta, index: int = 0) -> Frames:
        if isinstance(event, TextDelta | ReasoningDelta):
            if not event.text:
                return []
            kind = "message" if isinstance(event, TextDelta) else "reasoning"
            out = [] if self._open and self._open.kind == kind else self._begin(kind)
            return [*out, self._text(event.text)]
        if isinstance(event, ToolCallStart):
            return self._begin_call(event)
        return self._call_args(event)

    def _begin(self, kind: str) -> Frames:
        out = self._close("completed")
        item = self._open = _OpenItem(kind, conv.new_id("msg" if kind == "message" else "rs"))
        make = message_item if kind == "message" else reasoning_item
        part = text_part("") if kind == "message" else {"type": "reasoning_text", "text": ""}
        added = make(item.item_id, "in_progress", None)
        return [
            *out,
            self._emit("response.output_item.added", output_index=len(self._output), item=added),
            self._emit("response.content_part.added", **self._at(item), content_index=0, part=part),
        ]

    def _text(self, text: str) -> SseEvent:
        item = self._open
        assert item is not None
        item.pieces.append(text)
        if item.kind == "message":
            return self._emit(
                "response.output_text.delta", **self._at(item), content_index=0, delta=text, logprobs=[]
            )
        return self._emit("response.reasoning_text.delta", **self._at(item), content_index=0, delta=text)

    def _begin_call(self, event: ToolCallStart) -> Frames:
        out = self._close("completed")
        item = self._open = _OpenItem(
            "function_call", conv.new_id("fc"), call_index=event.index, call_id=event.id, name=event.name
        )
        added = call_item(item.item_id, "in_progress", item.call_id, item.name, "")
        return [*out, self._emit("response.output_item.added", output_index=len(self._output), item=added)]

    def _call_args(self, event: ToolCallArgsDelta) -> Frames:
        item = self._open
        if item is None or item.call_index != event.index or not event.arguments:
            return []
        item.pieces.append(event.arguments)
        return [self._emit("response.function_call_arguments.delta", **self._at(item), delta=event.arguments)]

    def _close(self, status: str) -> Frames:
        item, self._open = self._open, None
        if item is None:
            return []
        text, at = "".join(item.pieces), self._at(item)
        out: Frames
        if item.kind == "function_call":
            out = [self._emit("response.function_call_arguments.done", **at, arguments=text)]
            done = call_item(item.item_id, status, item.call_id, item.name, text)
        elif item.kind == "message":
            out = [
                self._emit("response.output_text.done", **at, content_index=0, text=text, logprobs=[]),
                self._emit("response.content_part.done", **at, content_index=0, part=text_part(text)),
            ]
            done = message_item(item.item_id, status, text)
        else:
            part = {"type": "reasoning_text", "text": text}
            out = [
                self._emit("response.reasoning_text.done", **at, content_index=0, text=text),
                self._emit("response.content_part.done", **at, content_index=0, part=part),
            ]
            done = reasoning_item(item.item_id, status, text)
        out.append(self._emit("response.output_item.done", output_index=len(self._output), item=done))
        self._output.append(done)
        return out

    def finish(self, event: Finished, index: int = 0) -> Frames:
        out = self._close("incomplete" if event.reason is FinishReason.LENGTH else "completed")
        status = finished_status(event.reason)
        response = response_json(self._job, self._ctx, status, self._output, event.usage)
        self._fmt.remember(self._job, response, self._output)
        return [*out, self._emit(f"response.{status}", response=response)]

    def error(self, exc: ServeError) -> Frames:
        out = self._close("incomplete")
        response = response_json(self._job, self._ctx, "failed", self._output, error=failure_json(exc))
        return [*out, self._emit("response.failed", response=response)]

    def heartbeat(self) -> Frame:
        return KEEP_ALIVE


def _own(job: Job) -> ResponsesJob:
    if not isinstance(job, ResponsesJob):
        raise TypeError(f"not a Responses job: {type(job).__name__}")
    return job


def error_body(exc: ServeError) -> bytes:
    return common.error_body(exc)


class OpenAIResponses:
    """The WireFormat of POST /v1/responses, plus GET and DELETE of stored responses.

    One instance per App: it owns the store that `previous_response_id` reads.
    """

    def __init__(self, store: ResponsesStore | None = None) -> None:
        self.store = store if store is not None else ResponsesStore()

    def parse(self, body: bytes, ctx: ProtocolContext) -> ResponsesJob:
        """Decode, validate and render one Responses request; ServeError 400/404 on a fault."""
        req = common.decode(_DECODER, body)
        _check_supported(req)
        history = self._history(req.previous_response_id)
        new_input = input_items(req.input)
        if not history and not new_input:
            raise InvalidRequest("`input` is required", param="input")
        messages = template_messages(req.instructions, history + new_input, len(history))
        kwargs = conv.thinking_kwargs(_thinking(req.reasoning))
        tools = _template_tools(req)
        grammar, forced = _grammar(req, tools)
        ids = conv.render_prompt(ctx, messages, tools, kwargs, "input")
        request = Request(
            id=conv.new_id(ID_PREFIX),
            prompt_tokens=tuple(ids),
            sampling=conv.sampling(ctx, req.temperature, req.top_p, req.top_k, req.min_p),
            max_tokens=req.max_output_tokens or ctx.defaults.max_tokens,
            tools=tuple(tools) if tools else None,
            grammar=grammar,
            forced_tool_calls=forced,
        )
        return ResponsesJob(
            request,
            stream=bool(req.stream),
            model=req.model or ctx.model_id,
            echo=_echo(req, request),
            history=history,
            new_input=new_input,
            store=req.store is not False,
        )

    def _history(self, previous_id: str | None) -> tuple[InputItem, ...]:
        if previous_id is None:
            return ()
        stored = self.store.get(previous_id)
        if stored is None:
            raise NotFound(
                f"Previous response with id '{previous_id}' not found.", param="previous_response_id"
            )
        return stored.conversation

    def renderer(self, job: Job, ctx: ProtocolContext) -> ResponseStream:
        return ResponseStream(self, _own(job), ctx)

    def to_json(self, job: Job, results: list[Result], ctx: ProtocolContext) -> bytes:
        own, result = _own(job), results[0]
        output = output_items(result)
        status = finished_status(result.finish_reason)
        return self.remember(own, response_json(own, ctx, status, output, result.usage), output)

    def remember(self, job: ResponsesJob, response: dict[str, Any], output: list[dict[str, Any]]) -> bytes:
        """The response's JSON, kept in the store first when the client asked (the default)."""
        body = orjson.dumps(response)
        if job.store:
            new_items = job.new_input + _conversation_items(output)
            size = len(body) + len(msgspec.json.encode(new_items))
            self.store.put(job.request.id, body, job.history + new_items, size)
        return body

    def error_body(self, exc: ServeError) -> bytes:
        return error_body(exc)

    def retrieve(self, response_id: str, query: bytes = b"") -> tuple[int, bytes]:
        """GET /v1/responses/{id}: (status, JSON body)."""
        stream = parse_qs(query.decode("latin-1")).get("stream", ["false"])[-1]
        if stream.lower() == "true":
            exc: ServeError = common.unsupported("stream", "streaming a stored response")
            return exc.status, error_body(exc)
        stored = self.store.get(response_id)
        if stored is None:
            return _not_found(response_id)
        return 200, stored.body

    def delete(self, response_id: str) -> tuple[int, bytes]:
        """DELETE /v1/responses/{id}: (status, JSON body)."""
        if not self.store.delete(response_id):
            return _not_found(response_id)
        return 200, orjson.dumps({"id": response_id, "object": "response.deleted", "deleted": True})


def _not_found(response_id: str) -> tuple[int, bytes]:
    exc = NotFound(f"Response with id '{response_id}' not found.")
    return exc.status, error_body(exc)
