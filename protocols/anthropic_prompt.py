"""The prompt of an Anthropic Messages request (POST /v1/messages and its count_tokens).

The conversation becomes the message dicts chat templates understand (see `conversation`):
`system` and system-role messages one leading system message, tool_use blocks assistant
`tool_calls`, tool_result blocks `tool` messages, prior-turn thinking `reasoning_content`.
Context management edits apply first (see `anthropic_context`). A server tool Anthropic runs
(web search, code execution, …) is not offered to the model, and a `Warning` note says so;
fields we cannot honour are refused by name. anthropic_messages builds the engine request
from the prompt made here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.protocols import anthropic_context
from mlx_serve.protocols import conversation as conv
from mlx_serve.protocols import openai_common as common
from mlx_serve.protocols.anthropic_request import (
    ContentBlock,
    DocumentBlock,
    ImageBlock,
    InputMessage,
    PromptBody,
    RedactedThinkingBlock,
    TextBlock,
    Thinking,
    ThinkingBlock,
    ThinkingDisabled,
    Tool,
    ToolChoiceNone,
    ToolReferenceBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from mlx_serve.protocols.contract import ProtocolContext
from mlx_serve.protocols.conversation import TemplateConversation

# Claude Code's first system block: its version (with a per-build suffix) and entry point, and
# in some versions a `cch=` value that changes per request. Anthropic does not show it to the
# model; left in, it would end the shared prefix of every conversation at its first line.
BILLING_HEADER = "x-anthropic-billing-header:"
# Tools Anthropic runs on its own servers: they need Anthropic's infrastructure.
HOSTED_TOOL_PREFIXES = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_", "mcp_toolset")
REFUSED_FIELDS = {
    "container": "`container` (code execution containers)",
    "mcp_servers": "`mcp_servers` (MCP connectors run by the API)",
    "compaction": "`compaction` (server-side summarising)",
}


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request rendered: token ids, the tools offered, what context management changed,
    the tokens before it did, and the notes for the `Warning` header."""

    ids: list[int]
    tools: tuple[dict[str, Any], ...] | None
    applied_edits: list[dict[str, Any]] | None
    original_tokens: int
    warnings: tuple[str, ...]


def render(req: PromptBody, ctx: ProtocolContext) -> Prompt:
    """The prompt of a request, after refusing what we cannot honour and applying its context
    management edits."""
    _check_supported(req)
    if not req.messages:
        raise InvalidRequest("`messages` must hold at least one message", param="messages")
    tools, warnings = offered_tools(req)
    kwargs = {**conv.thinking_kwargs(thinking_enabled(req.thinking)), **_effort_kwargs(req)}
    # Anthropic's prompt order is tools, system, messages: a system prompt that differs between
    # folders (Claude Code's names its memory folder) then leaves the tools' tokens shared.
    tools_first = bool(tools) and ctx.tokenizer.system_turns
    rendered: dict[tuple[int, ...], list[int]] = {}

    def ids_of(messages: Sequence[InputMessage]) -> list[int]:
        key = tuple(map(id, messages))
        if key not in rendered:
            template = template_messages(req, messages, ctx.keep_billing_header, tools_first)
            rendered[key] = conv.render_prompt(
                ctx, template, list(tools) if tools else None, kwargs, "messages"
            )
        return rendered[key]

    edited = anthropic_context.apply(req, lambda messages: len(ids_of(messages)))
    ids = ids_of(edited.messages)
    original = len(ids_of(req.messages)) if req.context_management is not None else len(ids)
    notes = warnings + conv.tool_support_warnings(ctx, tools)
    return Prompt(ids, tools, edited.applied, original, notes)


def offered_tools(req: PromptBody) -> tuple[tuple[dict[str, Any], ...] | None, tuple[str, ...]]:
    """The tools the model may call, as the template sees them (none with tool_choice none;
    deferred ones once a tool_reference loaded them), and the notes on those left out."""
    if not req.tools:
        return None, ()
    loaded = _referenced_tools(req.messages)
    out, notes = [], []
    for i, tool in enumerate(req.tools):
        if tool.type is not None and tool.type.startswith(HOSTED_TOOL_PREFIXES):
            notes.append(_hosted_note(tool))
        elif not tool.defer_loading or tool.name in loaded:
            out.append(_template_tool(tool, i))
    if isinstance(req.tool_choice, ToolChoiceNone) or not out:
        return None, tuple(notes)
    return tuple(out), tuple(notes)


def _hosted_note(tool: Tool) -> str:
    return conv.warning(
        f"tool {tool.name!r} ({tool.type}) runs on Anthropic's servers; this server cannot run it, "
        "so the model was not offered it"
    )


def _referenced_tools(messages: list[InputMessage]) -> set[str]:
    """Deferred tools loaded by tool search: every tool_reference in a tool result."""
    return {
        part.tool_name
        for m in messages
        if not isinstance(m.content, str)
        for block in m.content
        if isinstance(block, ToolResultBlock) and not isinstance(block.content, str)
        for part in block.content
        if isinstance(part, ToolReferenceBlock)
    }


def _template_tool(tool: Tool, i: int) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise InvalidRequest(
            f"tool type {tool.type!r} is not supported: only custom tools (name, description, "
            "input_schema) and, left out with a Warning, the server tools Anthropic runs",
            param=f"tools[{i}].type",
        )
    if tool.input_schema is None:
        raise InvalidRequest("a custom tool needs an `input_schema`", param=f"tools[{i}].input_schema")
    if tool.allowed_callers is not None and "direct" not in tool.allowed_callers:
        raise InvalidRequest(
            "a tool only code execution may call (`allowed_callers` without 'direct') is not supported",
            param=f"tools[{i}].allowed_callers",
        )
    description = tool.description
    if tool.input_examples:
        examples = "\n".join(orjson.dumps(e).decode() for e in tool.input_examples)
        description = f"{description or ''}\n\nExample inputs:\n{examples}".lstrip()
    return conv.function_tool(tool.name, description, tool.input_schema)


def _check_supported(req: PromptBody) -> None:
    for field, what in REFUSED_FIELDS.items():
        if getattr(req, field) is not None:
            raise common.unsupported(field, what)


def thinking_enabled(thinking: Thinking | None) -> bool | None:
    if thinking is None:
        return None
    return not isinstance(thinking, ThinkingDisabled)


def _effort_kwargs(req: PromptBody) -> dict[str, Any]:
    # output_config.effort goes to templates that read a level; thinking on or off stays `thinking`'s.
    effort = req.output_config.effort if req.output_config is not None else None
    return {} if effort is None else {"reasoning_effort": effort}


def template_messages(
    req: PromptBody,
    messages: Sequence[InputMessage],
    keep_billing_header: bool = False,
    tools_first: bool = False,
) -> list[dict[str, Any]]:
    """The conversation as chat-template message dicts (Claude Code's billing header left out
    unless the server keeps it: `--keep-billing-header`); with `tools_first`, the system text
    in a system turn after the template's tools."""
    turns = TemplateConversation(system_after_tools=tools_first)
    if req.system is not None:
        system = system_text(req.system, keep_billing_header)
        if system:
            turns.system(system)
    for i, msg in enumerate(messages):
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
            "a final assistant message (prefill) is not supported", param=f"messages[{len(messages) - 1}]"
        )
    return turns.messages()


def system_text(system: str | list[TextBlock], keep_billing_header: bool) -> str:
    return _text_only(_without_billing_header(system, keep_billing_header), "system", "system")


def _without_billing_header(system: str | list[TextBlock], keep: bool) -> str | list[TextBlock]:
    if keep or isinstance(system, str):
        return system
    return [b for b in system if not b.text.startswith(BILLING_HEADER)]


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


def _refused(block: Any, role: str, path: str) -> InvalidRequest:
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
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolReferenceBlock) and where == "tool_result":
            texts.append(f"Tool loaded: {block.tool_name}")  # its definition joins the tools offered
        else:
            raise _refused(block, where, f"{path}[{j}]")
    return conv.join_text(texts)
