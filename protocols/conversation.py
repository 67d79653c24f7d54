"""What the Anthropic and Responses formats share: conversations for chat templates, sampling,
prompt rendering and ids.

Both formats describe a conversation as typed items; chat templates understand OpenAI-style
message dicts, the same ones `openai_chat` renders, so one prompt costs the same tokens in
every format.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.types import SamplingParams
from mlx_serve.protocols.contract import ProtocolContext

TEXT_SEPARATOR = "\n\n"


def new_id(prefix: str) -> str:
    """`msg_…`, `resp_…`, `fc_…`: the format's prefix and 32 random hex digits."""
    return f"{prefix}_{uuid.uuid4().hex}"


def warning(text: str) -> str:
    """A `Warning` header value (RFC 7234 code 299, as admission writes them)."""
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'299 - "{quoted}"'


def tool_support_warnings(ctx: ProtocolContext, tools: Any) -> tuple[str, ...]:
    """The note a request offering tools gets when the model's chat template has no tool support
    (the tokenizer then describes the tools in a system message; calls are read as hermes)."""
    if not tools or getattr(ctx.tokenizer, "supports_tools", True):
        return ()
    return (
        warning(
            f"the chat template of {ctx.model_id} has no tool support: the tools are described to "
            "the model in a system message and its calls are read as <tool_call> JSON"
        ),
    )


def join_text(parts: list[str]) -> str:
    # Separate blocks stay separate paragraphs (Claude Code and Codex send several per turn).
    return TEXT_SEPARATOR.join(parts)


def tool_call(call_id: str | None, name: str, arguments: Any) -> dict[str, Any]:
    """An assistant tool call as chat templates index into it (arguments as a dict)."""
    out: dict[str, Any] = {} if call_id is None else {"id": call_id}
    out["type"] = "function"
    out["function"] = {"name": name, "arguments": arguments}
    return out


def function_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """A tool definition in the shape (and key order) `openai_chat` hands to templates."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    return {"function": function, "type": "function"}


def parse_arguments(raw: str, param: str) -> Any:
    """Tool-call arguments text as JSON (templates index into it); empty text is `{}`."""
    if not raw.strip():
        return {}
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"tool call arguments are not valid JSON: {exc}", param=param) from exc


class TemplateConversation:
    """Builds the message dicts chat templates understand, turn by turn.

    System text given before the first turn lands in one leading system message; system text
    that comes later (Claude Code's environment block, a mid-conversation instruction) stays a
    system turn where it stands, so the tokens before it do not change (the tokenizer folds it
    into the user's text for a template that takes a system message only first). Adjacent
    user or assistant turns merge into one, as Anthropic documents; tool calls and reasoning
    join the assistant turn they belong to.
    """

    def __init__(self, system_after_tools: bool = False) -> None:
        # Anthropic's order, tools then system: the system text goes in a system turn after an
        # empty leading one, which is where templates write their tools.
        self._after_tools = system_after_tools
        self._system: list[str] = []
        self._messages: list[dict[str, Any]] = []
        self._reasoning: list[str] = []

    def system(self, text: str) -> None:
        if not self._messages:
            self._system.append(text)
        elif (last := self._last("system")) is not None:
            last["content"] = join_text([last["content"], text])
        else:
            self._messages.append({"role": "system", "content": text})

    def user(self, text: str) -> None:
        last = self._last("user")
        if last is None:
            self._messages.append({"role": "user", "content": text})
        else:
            last["content"] = join_text([last["content"], text]) if last["content"] else text

    def reasoning(self, text: str) -> None:
        """Reasoning that came before the next assistant turn's text or tool calls."""
        self._reasoning.append(text)

    def assistant(self, text: str) -> None:
        turn = self._assistant_turn()
        turn["content"] = join_text([turn["content"], text]) if turn["content"] else text

    def tool_call(self, call_id: str | None, name: str, arguments: Any) -> None:
        self._assistant_turn().setdefault("tool_calls", []).append(tool_call(call_id, name, arguments))

    def tool_result(self, call_id: str | None, text: str) -> None:
        message: dict[str, Any] = {"role": "tool", "content": text}
        if call_id is not None:
            message["tool_call_id"] = call_id
        self._messages.append(message)

    @property
    def ends_with_assistant(self) -> bool:
        return bool(self._messages) and self._messages[-1]["role"] == "assistant"

    def messages(self) -> list[dict[str, Any]]:
        head = [{"role": "system", "content": join_text(self._system)}] if self._system else []
        if head and self._after_tools:
            head.insert(0, {"role": "system", "content": ""})
        return head + self._messages

    def _last(self, role: str) -> dict[str, Any] | None:
        last = self._messages[-1] if self._messages else None
        return last if last is not None and last["role"] == role else None

    def _assistant_turn(self) -> dict[str, Any]:
        turn = self._last("assistant")
        if turn is None:
            turn = {"role": "assistant", "content": ""}
            self._messages.append(turn)
        if self._reasoning:
            thought = join_text(self._reasoning)
            old = turn.get("reasoning_content")
            turn["reasoning_content"] = join_text([old, thought]) if old else thought
            self._reasoning = []
        return turn


def render_prompt(
    ctx: ProtocolContext,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    template_kwargs: dict[str, Any],
    param: str,
) -> list[int]:
    """Prompt token ids through the model's chat template; its complaints are 400s."""
    kwargs = {**(ctx.defaults.chat_template_args or {}), **template_kwargs}
    try:
        ids = ctx.tokenizer.render_chat(messages, tools, kwargs)
    except ValueError as exc:
        raise InvalidRequest(str(exc), param=param) from exc
    if not ids:
        raise InvalidRequest("the chat template rendered an empty prompt", param=param)
    return ids


def thinking_kwargs(enabled: bool | None) -> dict[str, Any]:
    """`enable_thinking` for hybrid-reasoning templates (Qwen3 and kin); others ignore it.

    None leaves the server's own chat-template arguments in charge.
    """
    return {} if enabled is None else {"enable_thinking": enabled}


def sampling(ctx: ProtocolContext, **given: Any) -> SamplingParams:
    """Request sampling over the server's defaults (see Defaults.sampling_for)."""
    return ctx.defaults.sampling_for(**given)
