"""OpenAI chat completions: POST /v1/chat/completions.

Messages are checked here, turned into the plain dicts chat templates expect (as mlx_lm.server
passes them) and rendered by the model's template into prompt token ids.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
import orjson
from msgspec import UNSET, Meta, Struct, UnsetType

from mlx_serve.engine.errors import InvalidRequest, ServeError
from mlx_serve.engine.types import (
    Admitted,
    Delta,
    Finished,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArgsDelta,
    ToolCallStart,
)
from mlx_serve.protocols import conversation as conv
from mlx_serve.protocols import openai_common as common
from mlx_serve.protocols import openai_render as render
from mlx_serve.protocols import reasoning, structured
from mlx_serve.protocols.contract import Frames, Job, ProtocolContext, Result

OBJECT = "chat.completion"
CHUNK_OBJECT = "chat.completion.chunk"
ID_PREFIX = "chatcmpl"


class _Part(Struct, frozen=True, tag_field="type"):
    """A content part; the media kinds carry nothing we read, they are refused by kind."""


class TextPart(_Part, frozen=True, tag="text"):
    text: str


class RefusalPart(_Part, frozen=True, tag="refusal"):
    refusal: str


class ImageUrlPart(_Part, frozen=True, tag="image_url"):
    pass


class InputImagePart(_Part, frozen=True, tag="input_image"):
    pass


class ImagePart(_Part, frozen=True, tag="image"):
    pass


class InputAudioPart(_Part, frozen=True, tag="input_audio"):
    pass


class FilePart(_Part, frozen=True, tag="file"):
    pass


ContentPart = TextPart | RefusalPart | ImageUrlPart | InputImagePart | ImagePart | InputAudioPart | FilePart
_MEDIA_INPUT: dict[type[_Part], str] = {
    ImageUrlPart: "vision",
    InputImagePart: "vision",
    ImagePart: "vision",
    InputAudioPart: "audio",
    FilePart: "file",
}


class FunctionCall(Struct, frozen=True):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(Struct, frozen=True):
    function: FunctionCall
    id: str | None = None
    type: Literal["function"] = "function"


class ChatMessage(Struct, frozen=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(Struct, frozen=True):
    name: str
    description: str | UnsetType | None = UNSET
    parameters: dict[str, Any] | UnsetType = UNSET
    strict: bool | UnsetType | None = UNSET


class Tool(Struct, frozen=True):
    function: FunctionDef
    type: Literal["function"] = "function"


class FunctionName(Struct, frozen=True):
    name: str


class NamedToolChoice(Struct, frozen=True):
    """`{"type": "function", "function": {"name": …}}`: a call to that function, and only it."""

    function: FunctionName
    type: Literal["function"] = "function"


class ChatCompletionBody(common.OpenAIFields, frozen=True, kw_only=True):
    """The body of POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    # llama.cpp's per-request thinking budget (-1 unbounded, 0 no thinking) and its message.
    thinking_budget_tokens: Annotated[int, Meta(ge=-1)] | None = None
    thinking_budget_message: str | None = None
    # Answer-changing fields refused until supported.
    functions: Any = None
    function_call: Any = None
    audio: Any = None


_DECODER = msgspec.json.Decoder(ChatCompletionBody)


def parse_body(body: bytes, ctx: ProtocolContext) -> Job:
    """Decode, validate and render one chat request into a Job; ServeError 400 on any fault."""
    req = common.decode(_DECODER, body)
    common.check_supported(req, ctx)
    _check_chat_supported(req)
    messages = [_template_message(m, i) for i, m in enumerate(req.messages)]
    tools = [msgspec.to_builtins(t) for t in req.tools] if req.tools else None
    # reasoning_effort sets the template's own switches; explicit template kwargs win.
    template_kwargs = {
        **(ctx.defaults.chat_template_args or {}),
        **reasoning.effort_kwargs(req.reasoning_effort),
        **(req.chat_template_kwargs or {}),
    }
    thinking = reasoning.thinking_budget(
        ctx,
        req.thinking_budget_tokens,
        req.thinking_budget_message,
        "thinking_budget_tokens",
        req.reasoning_effort,
    )
    try:
        ids = ctx.tokenizer.render_chat(messages, tools, template_kwargs)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param="messages") from exc
    if not ids:
        raise InvalidRequest("the chat template rendered an empty prompt", param="messages")
    offered = tools if req.tool_choice != "none" else None
    return common.build_job(
        req,
        ids,
        ctx,
        ID_PREFIX,
        offered,
        common.chat_logprobs(req),
        _forced_calls(req, offered),
        conv.tool_support_warnings(ctx, offered)
        + reasoning.effort_warnings(ctx, req.reasoning_effort, "reasoning_effort"),
        thinking,
    )


def _forced_calls(req: ChatCompletionBody, tools: list[dict[str, Any]] | None) -> str | None:
    choice = req.tool_choice
    name = choice.function.name if isinstance(choice, NamedToolChoice) else None
    return structured.forced_calls(tools, name, choice == "required", req.parallel_tool_calls is not False)


def _check_chat_supported(req: ChatCompletionBody) -> None:
    if req.functions is not None or req.function_call is not None:
        param = "functions" if req.functions is not None else "function_call"
        raise common.unsupported(param, f"`{param}` (deprecated; use `tools`)")
    if req.audio is not None:
        raise common.unsupported("audio", "audio output")


def _template_message(msg: ChatMessage, index: int) -> dict[str, Any]:
    # Few chat templates know "developer"; OpenAI treats it as the system prompt.
    role = "system" if msg.role == "developer" else msg.role
    out: dict[str, Any] = {"role": role, "content": _flatten(msg.content, index)}
    if msg.name is not None:
        out["name"] = msg.name
    if msg.tool_calls:
        out["tool_calls"] = [_template_tool_call(c, index, j) for j, c in enumerate(msg.tool_calls)]
    if msg.tool_call_id is not None:
        out["tool_call_id"] = msg.tool_call_id
    if msg.reasoning_content is not None:
        out["reasoning_content"] = msg.reasoning_content
    return out


def _flatten(content: str | list[ContentPart] | None, index: int) -> str:
    """Text parts joined with "" (as mlx_lm.server does); media parts are refused."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, RefusalPart):
            texts.append(part.refusal)
        else:
            kind = _MEDIA_INPUT[type(part)]
            raise InvalidRequest(f"this model has no {kind} input", param=f"messages[{index}].content[{j}]")
    return "".join(texts)


def _template_tool_call(call: ToolCall, index: int, j: int) -> dict[str, Any]:
    # Templates index into the arguments, so a JSON string becomes a dict, as in mlx_lm.server.
    out: dict[str, Any] = {} if call.id is None else {"id": call.id}
    out["type"] = call.type
    out["function"] = {
        "name": call.function.name,
        "arguments": _arguments(call.function.arguments, f"messages[{index}].tool_calls[{j}]"),
    }
    return out


def _arguments(raw: str | dict[str, Any], path: str) -> Any:
    if not isinstance(raw, str):
        return raw
    if not raw.strip():
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(
            f"tool call arguments are not valid JSON: {exc}", param=f"{path}.function.arguments"
        ) from exc


def _choice(
    delta: dict[str, Any],
    finish_reason: str | None = None,
    index: int = 0,
    logprobs: tuple[TokenLogprob, ...] = (),
) -> dict[str, Any]:
    return {
        "index": index,
        "delta": delta,
        "logprobs": _logprobs(logprobs) if logprobs else None,
        "finish_reason": finish_reason,
    }


def _logprobs(entries: tuple[TokenLogprob, ...]) -> dict[str, Any]:
    return {"content": [render.token_logprob_json(t) for t in entries], "refusal": None}


class ChatStream(render.ChunkStream):
    """chat.completion.chunk frames: a role primer, content deltas, a finish chunk."""

    def start(self, admitted: Admitted | None = None) -> Frames:
        return [self.frame(_choice({"role": "assistant", "content": ""}, index=i)) for i in range(self._n)]

    def delta(self, event: Delta, index: int = 0) -> Frames:
        if isinstance(event, ToolCallStart):  # the call's id and name come first, arguments after
            call = {
                "index": event.index,
                "id": event.id,
                "type": "function",
                "function": {"name": event.name, "arguments": ""},
            }
            return [self.frame(_choice({"tool_calls": [call]}, index=index))]
        if isinstance(event, ReasoningDelta):  # both names clients read reasoning under
            return [
                self.frame(_choice({"reasoning": event.text, "reasoning_content": event.text}, index=index))
            ]
        if isinstance(event, ToolCallArgsDelta):
            call = {"index": event.index, "function": {"arguments": event.arguments}}
            return [self.frame(_choice({"tool_calls": [call]}, index=index))]
        if not isinstance(event, TextDelta) or not (event.text or event.logprobs):
            return []
        return [self.frame(_choice({"content": event.text}, index=index, logprobs=event.logprobs))]

    def finish(self, event: Finished, index: int = 0) -> Frames:
        return self.closing(_choice({}, event.reason.value, index), event.usage, index)


def completion_json(job: Job, results: list[Result], ctx: ProtocolContext) -> dict[str, Any]:
    want = job.request.logprobs is not None
    choices = [_message_choice(i, r, want) for i, r in enumerate(results)]
    usage = render.combined_usage([r.usage for r in results], job.n)
    return {**render.response_head(job, ctx, OBJECT), "choices": choices, "usage": render.usage_json(usage)}


def _message_choice(index: int, result: Result, want_logprobs: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": result.text,
        "refusal": None,
        "annotations": [],
    }
    if result.reasoning:
        message["reasoning"] = message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        message["content"] = result.text or None
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in result.tool_calls
        ]
    logprobs = _logprobs(result.logprobs) if want_logprobs else None
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": result.finish_reason.value,
    }


class OpenAIChat:
    """The WireFormat of POST /v1/chat/completions."""

    def parse(self, body: bytes, ctx: ProtocolContext) -> Job:
        return parse_body(body, ctx)

    def renderer(self, job: Job, ctx: ProtocolContext) -> ChatStream:
        return ChatStream(render.response_head(job, ctx, CHUNK_OBJECT), job.include_usage, job.n, job.choices)

    def to_json(self, job: Job, results: list[Result], ctx: ProtocolContext) -> bytes:
        return orjson.dumps(completion_json(job, results, ctx))

    def error_body(self, exc: ServeError) -> bytes:
        return render.error_body(exc)


FORMAT = OpenAIChat()
