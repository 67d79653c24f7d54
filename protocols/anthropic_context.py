"""Anthropic context management: the `context_management.edits` of a Messages request applied to
its conversation before templating, as Anthropic documents them, with the `applied_edits` the
response reports.

- clear_thinking_20251015 keeps the thinking blocks of the `keep` most recent assistant turns
  (`"all"`: every one) and drops the others. Without this edit, a request with thinking on keeps
  only the last turn's, Anthropic's default.
- clear_tool_uses_20250919, once the prompt passes `trigger` (input tokens or tool uses), puts a
  placeholder in place of the results of all but the `keep` most recent tool uses (never those of
  `exclude_tools`), and with `clear_tool_inputs` empties those calls' inputs too; with
  `clear_at_least`, only when that many input tokens go.
- compact_20260112 (server-side summarising) is not built: it is refused, naming the edit, only
  for a prompt past its trigger, since below it the edit changes nothing.

Token counts are the rendered prompt's, before and after each edit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from msgspec import structs

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.protocols.anthropic_request import (
    ClearThinking,
    ClearToolUses,
    Compact,
    ContentBlock,
    InputMessage,
    InputTokens,
    PromptBody,
    RedactedThinkingBlock,
    ThinkingAdaptive,
    ThinkingBlock,
    ThinkingEnabled,
    ThinkingTurns,
    ToolResultBlock,
    ToolUseBlock,
)

CLEARED_RESULT = "[this tool result was cleared to save context]"
COMPACT_DEFAULT_TRIGGER = 150_000
Messages = Sequence[InputMessage]
Count = Callable[[Messages], int]


@dataclass(frozen=True, slots=True)
class Edited:
    """The conversation the template sees, and the edits that changed it (None: none asked)."""

    messages: list[InputMessage]
    applied: list[dict[str, Any]] | None


def apply(req: PromptBody, count: Count) -> Edited:
    """Apply the request's edits in order; `count` gives a conversation's prompt tokens."""
    messages = list(req.messages)
    edits = req.context_management.edits if req.context_management is not None else []
    if _thinking_on(req) and not any(isinstance(e, ClearThinking) for e in edits):
        messages, _ = clear_thinking(messages, 1)
    applied: list[dict[str, Any]] = []
    for i, edit in enumerate(edits):
        if isinstance(edit, ClearThinking):
            new, turns = clear_thinking(messages, _turns_kept(edit))
            if turns:
                cleared = count(messages) - count(new)
                applied.append(
                    {"type": _tag(edit), "cleared_thinking_turns": turns, "cleared_input_tokens": cleared}
                )
                messages = new
        elif isinstance(edit, ClearToolUses):
            messages = _clear_tool_uses(messages, edit, count, applied)
        else:
            _refuse_compaction(edit, count(messages), i)
    return Edited(messages, applied if req.context_management is not None else None)


def _thinking_on(req: PromptBody) -> bool:
    return isinstance(req.thinking, ThinkingEnabled | ThinkingAdaptive)


def _turns_kept(edit: ClearThinking) -> int | None:
    keep = edit.keep
    if isinstance(keep, ThinkingTurns):
        return keep.value
    return None  # "all", {"type": "all"}


def clear_thinking(messages: list[InputMessage], keep: int | None) -> tuple[list[InputMessage], int]:
    """Drop thinking blocks from all but the `keep` most recent assistant turns with any
    (None: keep all); the new conversation and how many turns lost theirs."""
    thinking_turns = [i for i, m in enumerate(messages) if m.role == "assistant" and _has_thinking(m)]
    if keep is None or len(thinking_turns) <= keep:
        return messages, 0
    cleared = set(thinking_turns[: len(thinking_turns) - keep])
    out = [_without_thinking(m) if i in cleared else m for i, m in enumerate(messages)]
    return out, len(cleared)


def _has_thinking(message: InputMessage) -> bool:
    return not isinstance(message.content, str) and any(
        isinstance(b, ThinkingBlock | RedactedThinkingBlock) for b in message.content
    )


def _without_thinking(message: InputMessage) -> InputMessage:
    assert not isinstance(message.content, str)
    kept = [b for b in message.content if not isinstance(b, ThinkingBlock | RedactedThinkingBlock)]
    return structs.replace(message, content=kept)


def _clear_tool_uses(
    messages: list[InputMessage], edit: ClearToolUses, count: Count, applied: list[dict[str, Any]]
) -> list[InputMessage]:
    uses = [
        b
        for m in messages
        if m.role == "assistant" and not isinstance(m.content, str)
        for b in m.content
        if isinstance(b, ToolUseBlock)
    ]
    trigger = edit.trigger
    before = count(messages) if isinstance(trigger, InputTokens) or edit.clear_at_least else 0
    fired = before > trigger.value if isinstance(trigger, InputTokens) else len(uses) > trigger.value
    if not fired:
        return messages
    kept = {u.id for u in uses[len(uses) - edit.keep.value :]} if edit.keep.value else set()
    excluded = set(edit.exclude_tools or ())
    targets = {u.id: u.name for u in uses if u.id not in kept and u.name not in excluded}
    new, cleared = _cleared(messages, targets, edit.clear_tool_inputs)
    if not cleared:
        return messages
    freed = before - count(new) if before else count(messages) - count(new)
    if edit.clear_at_least is not None and freed < edit.clear_at_least.value:
        return messages
    applied.append({"type": _tag(edit), "cleared_tool_uses": cleared, "cleared_input_tokens": freed})
    return new


def _cleared(
    messages: list[InputMessage], targets: dict[str, str], inputs: bool | list[str] | None
) -> tuple[list[InputMessage], int]:
    """The conversation with the targets' results (and inputs, as asked) cleared; how many."""
    with_results = {
        b.tool_use_id
        for m in messages
        if not isinstance(m.content, str)
        for b in m.content
        if isinstance(b, ToolResultBlock) and b.tool_use_id in targets and b.content != CLEARED_RESULT
    }
    if not with_results:
        return messages, 0

    def edit(block: ContentBlock) -> ContentBlock:
        if isinstance(block, ToolResultBlock) and block.tool_use_id in with_results:
            return structs.replace(block, content=CLEARED_RESULT, is_error=False)
        if isinstance(block, ToolUseBlock) and block.id in with_results and _clears_input(inputs, block.name):
            return structs.replace(block, input={})
        return block

    out = [
        m if isinstance(m.content, str) else structs.replace(m, content=[edit(b) for b in m.content])
        for m in messages
    ]
    return out, len(with_results)


def _clears_input(inputs: bool | list[str] | None, name: str) -> bool:
    return inputs is True or (isinstance(inputs, list) and name in inputs)


def _refuse_compaction(edit: Compact, prompt_tokens: int, index: int) -> None:
    trigger = edit.trigger.value if edit.trigger is not None else COMPACT_DEFAULT_TRIGGER
    if prompt_tokens > trigger:
        raise InvalidRequest(
            f"context_management edit `compact_20260112` is not supported: this prompt of {prompt_tokens} "
            f"tokens is past its trigger ({trigger}), and the server cannot summarise the conversation",
            param=f"context_management.edits[{index}]",
        )


def _tag(edit: ClearThinking | ClearToolUses) -> str:
    return str(type(edit).__struct_config__.tag)
