"""Anthropic Messages: POST /v1/messages and POST /v1/messages/count_tokens.

The conversation becomes the message dicts chat templates understand (see `conversation`):
`system` and system-role messages one leading system message, tool_use blocks assistant
`tool_calls`, tool_result blocks `tool` messages, prior-turn thinking `reasoning_content`.
Every field the current SDK sends is accepted; one we cannot honour is a 400 that names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgspec
import orjson
from msgspec import Meta, Struct

from engine.errors import EngineFailed, InvalidRequest, ServeError
from engine.tools.json_scan import partial_value
from engine.types import (
    Delta,
    Finished,
    FinishReason,
    Request,
    TextDelta,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from protocols import conversation as conv
from protocols import openai_common as common
from protocols import structured
from protocols.contract import Frame, Frames, Job, ProtocolContext, Result, SseEvent, ToolCall
from protocols.conversation import TemplateConversation

ID_PREFIX = "msg"
TOOL_ID_PREFIX = "toolu_"

_STOP_REASONS = {
    FinishReason.STOP: "end_turn",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.TOOL_CALLS: "tool_use",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


# --- request -----------------------------------------------------------------------------------


class _Block(Struct, frozen=True, tag_field="type"):
    """A content block. Fields we do not read (cache_control, citations) are ignored."""


class TextBlock(_Block, frozen=True, tag="text"):
    text: str


class ImageBlock(_Block, frozen=True, tag="image"):
    pass


class DocumentBlock(_Block, frozen=True, tag="document"):
    pass


class ThinkingBlock(_Block, frozen=True, tag="thinking"):
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Block, frozen=True, tag="redacted_thinking"):
    data: str = ""


class ToolUseBlock(_Block, frozen=True, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block, frozen=True, tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] = ""
    is_error: bool = False


ContentBlock = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | ToolResultBlock
)


class InputMessage(Struct, frozen=True):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(Struct, frozen=True, kw_only=True):
    """A custom tool; Anthropic's own tool kinds (bash_…, web_search_…) carry another `type`."""

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class _ToolChoice(Struct, frozen=True, tag_field="type"):
    pass


class ToolChoiceAuto(_ToolChoice, frozen=True, tag="auto"):
    # Not enforced: the engine cannot cap a turn at one call yet.
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(_ToolChoice, frozen=True, tag="any"):
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(_ToolChoice, frozen=True, tag="tool"):
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(_ToolChoice, frozen=True, tag="none"):
    pass


ToolChoice = ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone
Display = Literal["summarized", "omitted"] | None


class _Thinking(Struct, frozen=True, tag_field="type"):
    pass


class ThinkingEnabled(_Thinking, frozen=True, tag="enabled"):
    # The budget is not enforced on its own; max_tokens still caps thinking plus answer.
    budget_tokens: Annotated[int, Meta(ge=1)]
    display: Display = None


class ThinkingAdaptive(_Thinking, frozen=True, tag="adaptive"):
    display: Display = None


class ThinkingBetweenTools(_Thinking, frozen=True, tag="between_tools"):
    pass


class ThinkingDisabled(_Thinking, frozen=True, tag="disabled"):
    pass


Thinking = ThinkingEnabled | ThinkingAdaptive | ThinkingBetweenTools | ThinkingDisabled


class OutputFormat(Struct, frozen=True):
    """Structured output: the answer's text is JSON valid against `schema`."""

    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(Struct, frozen=True):
    # `effort` is guidance on how hard to think; a local model takes it as a hint it may ignore.
    effort: str | None = None
    format: OutputFormat | None = None


class Metadata(Struct, frozen=True):
    user_id: str | None = None


class PromptBody(Struct, frozen=True, kw_only=True):
    """What renders the prompt: the body of POST /v1/messages/count_tokens.

    Routing and billing fields (service_tier, speed, inference_geo, workspace_id,
    user_profile_id, cache_control, diagnostics) change nothing here and are ignored.
    """

    model: str
    messages: Annotated[list[InputMessage], Meta(min_length=1)]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the structured-outputs beta's spelling
    # Answer-changing fields refused until supported.
    container: Any = None
    mcp_servers: Any = None
    context_management: Any = None


class MessagesBody(PromptBody, frozen=True, kw_only=True):
    """The body of POST /v1/messages."""

    max_tokens: common.PositiveInt
    stop_sequences: common.StopList | None = None
    stream: bool | None = None
    metadata: Metadata | None = None
    # The current SDK no longer sends these; older clients do.
    temperature: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None


_DECODER = msgspec.json.Decoder(MessagesBody)
_COUNT_DECODER = msgspec.json.Decoder(PromptBody)


@dataclass(frozen=True, slots=True)
class MessagesJob(Job):
    """A Messages call: `show_thinking` is False when thinking.display is "omitted"."""

    show_thinking: bool = True


# --- parse -------------------------------------------------------------------------------------


def parse_body(body: bytes, ctx: ProtocolContext) -> MessagesJob:
    """Decode, validate and render one Messages request; ServeError 400 on any fault."""
    req = common.decode(_DECODER, body)
    grammar, forced = _grammar(req)
    request = Request(
        id=conv.new_id(ID_PREFIX),
        prompt_tokens=tuple(render(req, ctx)),
        sampling=conv.sampling(ctx, req.temperature, req.top_p, req.top_k),
        max_tokens=req.max_tokens,
        stop=tuple(req.stop_sequences or ()),
        tools=offered_tools(req),
        grammar=grammar,
        forced_tool_calls=forced,
    )
    return MessagesJob(
        request, stream=bool(req.stream), model=req.model, show_thinking=_display(req.thinking) != "omitted"
    )


def count_tokens(body: bytes, ctx: ProtocolContext) -> tuple[int, bytes]:
    """POST /v1/messages/count_tokens: (status, JSON body), errors in Anthropic's envelope."""
    try:
        ids = render(common.decode(_COUNT_DECODER, body), ctx)
    except ServeError as exc:
        return exc.status, error_body(exc)
    return 200, orjson.dumps({"input_tokens": len(ids)})


def offered_tools(req: PromptBody) -> tuple[dict[str, Any], ...] | None:
    """The tools the model may call (none with tool_choice none), as the template sees them."""
    tools = None if isinstance(req.tool_choice, ToolChoiceNone) else _template_tools(req.tools)
    return tuple(tools) if tools else None


def render(req: PromptBody, ctx: ProtocolContext) -> list[int]:
    """The prompt token ids of a request, after refusing what we cannot honour."""
    _check_supported(req)
    messages = template_messages(req)
    tools = offered_tools(req)
    kwargs = conv.thinking_kwargs(_thinking_enabled(req.thinking))
    return conv.render_prompt(ctx, messages, list(tools) if tools else None, kwargs, "messages")


def _grammar(req: PromptBody) -> tuple[str | None, bool]:
    """The grammar the answer follows (a forced tool choice or the output format), and whether
    it forces tool calls."""
    choice = req.tool_choice
    name = choice.name if isinstance(choice, ToolChoiceTool) else None
    # `any` may make several calls unless told not to; a named tool makes one.
    parallel = isinstance(choice, ToolChoiceAny) and not choice.disable_parallel_tool_use
    forced = structured.forced_calls(offered_tools(req), name, isinstance(choice, ToolChoiceAny), parallel)
    fmt, param = req.output_format, "output_format"
    if req.output_config is not None and req.output_config.format is not None:
        if fmt is not None:
            raise InvalidRequest(
                "give `output_config.format` or `output_format`, not both", param="output_format"
            )
        fmt, param = req.output_config.format, "output_config.format"
    output = None if fmt is None else structured.json_schema(fmt.schema, f"{param}.schema")
    return structured.pick(forced, output, param)


def _check_supported(req: PromptBody) -> None:
    for field in ("container", "mcp_servers", "context_management"):
        if getattr(req, field) is not None:
            raise common.unsupported(field)


def _thinking_enabled(thinking: Thinking | None) -> bool | None:
    if thinking is None:
        return None
    return not isinstance(thinking, ThinkingDisabled)


def _display(thinking: Thinking | None) -> Display:
    return thinking.display if isinstance(thinking, ThinkingEnabled | ThinkingAdaptive) else None


def template_messages(req: PromptBody) -> list[dict[str, Any]]:
    """The conversation as chat-template message dicts."""
    turns = TemplateConversation()
    if req.system is not None:
        turns.system(_text_only(req.system, "system", "system"))
    for i, msg in enumerate(req.messages):
        if msg.role == "system":
            turns.system(_text_only(msg.content, "system", f"messages[{i}].content"))
        elif isinstance(msg.content, str):
            (turns.user if msg.role == "user" else turns.assistant)(msg.content)
        else:
            for j, block in enumerate(msg.content):
                _add_block(turns, msg.role, block, f"messages[{i}].content[{j}]")
    if turns.ends_with_assistant:
        # Anthropic's answer for models without prefill: the template cannot continue a turn.
        raise InvalidRequest(
            "a final assistant message (prefill) is not supported", param=f"messages[{len(req.messages) - 1}]"
        )
    return turns.messages()


def _add_block(turns: TemplateConversation, role: str, block: ContentBlock, path: str) -> None:
    if isinstance(block, TextBlock):
        (turns.user if role == "user" else turns.assistant)(block.text)
    elif isinstance(block, ToolResultBlock) and role == "user":
        text = _text_only(block.content, "tool_result", f"{path}.content")
        turns.tool_result(block.tool_use_id, f"Error: {text}" if block.is_error else text)
    elif isinstance(block, ToolUseBlock) and role == "assistant":
        turns.tool_call(block.id, block.name, block.input)
    elif isinstance(block, ThinkingBlock) and role == "assistant":
        turns.reasoning(block.thinking)
    elif isinstance(block, RedactedThinkingBlock) and role == "assistant":
        pass  # Claude's encrypted reasoning: nothing a local model can read
    else:
        raise _refused(block, role, path)


def _refused(block: _Block, role: str, path: str) -> InvalidRequest:
    if isinstance(block, ImageBlock):
        return InvalidRequest("this model has no vision input", param=path)
    if isinstance(block, DocumentBlock):
        return InvalidRequest("this model has no document input", param=path)
    kind = type(block).__struct_config__.tag
    return InvalidRequest(f"`{kind}` blocks are not allowed in {role} content", param=path)


def _text_only(content: str | list[Any], where: str, path: str) -> str:
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for j, block in enumerate(content):
        if not isinstance(block, TextBlock):
            raise _refused(block, where, f"{path}[{j}]")
        texts.append(block.text)
    return conv.join_text(texts)


def _template_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise InvalidRequest(
                f"tool type {tool.type!r} is not supported: only custom tools "
                "(name, description, input_schema)",
                param=f"tools[{i}].type",
            )
        if tool.input_schema is None:
            raise InvalidRequest("a custom tool needs an `input_schema`", param=f"tools[{i}].input_schema")
        out.append(conv.function_tool(tool.name, tool.description, tool.input_schema))
    return out


# --- answers -----------------------------------------------------------------------------------


def tool_use_id(call_id: str) -> str:
    """Engine call ids (`call_…`) in Anthropic's spelling (`toolu_…`)."""
    if call_id.startswith(TOOL_ID_PREFIX):
        return call_id
    return TOOL_ID_PREFIX + call_id.removeprefix("call_")


def stop_reason(reason: FinishReason, stop_sequence: str | None) -> str:
    return "stop_sequence" if stop_sequence is not None else _STOP_REASONS[reason]


def usage_json(usage: Usage) -> dict[str, Any]:
    """Anthropic counts cache reads apart: input + cache_read is the whole prompt."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        **common.speculation_json(usage),
    }


def _message_head(job: Job) -> dict[str, Any]:
    return {"id": job.request.id, "type": "message", "role": "assistant", "model": job.model}


def _tool_input(call: ToolCall) -> dict[str, Any]:
    raw = call.arguments.strip() or "{}"
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # A call cut short (max_tokens, a stop sequence): what it holds so far, as the SDK
        # reads the same arguments streamed.
        value = partial_value(raw) or {}
    if not isinstance(value, dict):  # the engine's parsers send objects: this is its bug
        raise EngineFailed(f"the model's call to {call.name!r} has arguments that are not a JSON object")
    return value


def message_json(job: MessagesJob, result: Result) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if result.reasoning:
        thinking = result.reasoning if job.show_thinking else ""
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    if result.text:
        content.append({"type": "text", "text": result.text})
    content += [
        {"type": "tool_use", "id": tool_use_id(c.id), "name": c.name, "input": _tool_input(c)}
        for c in result.tool_calls
    ]
    return {
        **_message_head(job),
        "content": content,
        "stop_reason": stop_reason(result.finish_reason, result.stop_sequence),
        "stop_sequence": result.stop_sequence,
        "usage": usage_json(result.usage),
    }


def error_json(exc: ServeError) -> dict[str, Any]:
    """Anthropic's error envelope; the status code comes from `exc.status`."""
    kind = _ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def error_body(exc: ServeError) -> bytes:
    return orjson.dumps(error_json(exc))


class MessageStream:
    """Anthropic's event grammar: message_start, ping, one content block at a time
    (start, deltas, stop), message_delta with the stop reason and usage, message_stop.

    The engine emits a turn's parts one after another (tool calls included), so exactly one
    block is open at a time.
    """

    def __init__(self, job: MessagesJob) -> None:
        self._job = job
        self._index = -1
        self._open: str | None = None
        self._tool_blocks: dict[int, int] = {}

    def start(self) -> Frames:
        usage = usage_json(Usage(len(self._job.request.prompt_tokens), 0))
        message = {
            **_message_head(self._job),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }
        return [_event("message_start", message=message), self.heartbeat()]

    def delta(self, event: Delta, index: int = 0) -> Frames:
        if isinstance(event, ToolCallStart):
            out = self._begin(
                "tool_use", {"type": "tool_use", "id": tool_use_id(event.id), "name": event.name, "input": {}}
            )
            self._tool_blocks[event.index] = self._index
            return out
        if isinstance(event, ToolCallArgsDelta):
            return self._tool_args(event)
        if not event.text:
            return []
        if isinstance(event, TextDelta):
            out = self._open_as("text", {"type": "text", "text": ""})
            return [*out, self._delta(self._index, {"type": "text_delta", "text": event.text})]
        out = self._open_as("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        if not self._job.show_thinking:
            return out
        return [*out, self._delta(self._index, {"type": "thinking_delta", "thinking": event.text})]

    def _open_as(self, kind: str, block: dict[str, Any]) -> Frames:
        return [] if self._open == kind else self._begin(kind, block)

    def _tool_args(self, event: ToolCallArgsDelta) -> Frames:
        index = self._tool_blocks.get(event.index)
        if index is None or not event.arguments:
            return []
        return [self._delta(index, {"type": "input_json_delta", "partial_json": event.arguments})]

    def _begin(self, kind: str, block: dict[str, Any]) -> Frames:
        out = self._close()
        self._index += 1
        self._open = kind
        return [*out, _event("content_block_start", index=self._index, content_block=block)]

    def _delta(self, index: int, delta: dict[str, Any]) -> SseEvent:
        return _event("content_block_delta", index=index, delta=delta)

    def _close(self) -> Frames:
        if self._open is None:
            return []
        self._open = None
        return [_event("content_block_stop", index=self._index)]

    def finish(self, event: Finished, index: int = 0) -> Frames:
        delta = {
            "stop_reason": stop_reason(event.reason, event.stop_sequence),
            "stop_sequence": event.stop_sequence,
        }
        return [
            *self._close(),
            _event("message_delta", delta=delta, usage=usage_json(event.usage)),
            _event("message_stop"),
        ]

    def error(self, exc: ServeError) -> Frames:
        return [SseEvent(error_json(exc), "error")]

    def heartbeat(self) -> Frame:
        return _event("ping")


def _event(kind: str, **payload: Any) -> SseEvent:
    """Anthropic names each event after its payload's `type`, which comes first."""
    return SseEvent({"type": kind, **payload}, kind)


def _own(job: Job) -> MessagesJob:
    if not isinstance(job, MessagesJob):
        raise TypeError(f"not a Messages job: {type(job).__name__}")
    return job


class AnthropicMessages:
    """The WireFormat of POST /v1/messages."""

    def parse(self, body: bytes, ctx: ProtocolContext) -> MessagesJob:
        return parse_body(body, ctx)

    def renderer(self, job: Job, ctx: ProtocolContext) -> MessageStream:
        return MessageStream(_own(job))

    def to_json(self, job: Job, results: list[Result], ctx: ProtocolContext) -> bytes:
        return orjson.dumps(message_json(_own(job), results[0]))

    def error_body(self, exc: ServeError) -> bytes:
        return error_body(exc)

    def count_tokens(self, body: bytes, ctx: ProtocolContext) -> tuple[int, bytes]:
        return count_tokens(body, ctx)


FORMAT = AnthropicMessages()
