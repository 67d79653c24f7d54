"""Anthropic Messages request bodies as msgspec Structs: content blocks, tools, tool choice,
thinking, output format and context management.

Fields that only route or bill (service_tier, speed, inference_geo, workspace_id,
user_profile_id, billing_policy, fallbacks, cache_control) change nothing here and
are not read; README lists every beta field and what it does here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from mlx_serve.protocols import openai_common as common

Count = Annotated[int, Meta(ge=0)]


class _Block(Struct, frozen=True, tag_field="type"):
    """A content block. Fields we do not read (cache_control, citations) are ignored."""


class TextBlock(_Block, frozen=True, tag="text"):
    text: str


class ImageBlock(_Block, frozen=True, tag="image"):
    pass


class DocumentBlock(_Block, frozen=True, tag="document"):
    pass


class ToolReferenceBlock(_Block, frozen=True, tag="tool_reference"):
    """Tool search's answer inside a tool_result: the named deferred tool is now loaded."""

    tool_name: str


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
    content: str | list[TextBlock | ImageBlock | DocumentBlock | ToolReferenceBlock] = ""
    is_error: bool = False


ContentBlock = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ToolUseBlock
    | ToolResultBlock
    | ToolReferenceBlock
)


class InputMessage(Struct, frozen=True):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Tool(Struct, frozen=True, kw_only=True):
    """A custom tool; Anthropic's own tool kinds (bash_…, web_search_…) carry another `type`.

    `defer_loading` tools stay out of the prompt until a tool_reference block loads them (tool
    search); `input_examples` join the description; `strict` is enforced when tool_choice
    forces a call, as every schema is; `eager_input_streaming` is how input always streams.
    """

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    defer_loading: bool = False
    input_examples: list[dict[str, Any]] | None = None
    strict: bool | None = None
    eager_input_streaming: bool | None = None
    allowed_callers: list[str] | None = None


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
# "updates" (the thinking-display-updates beta) streams thinking as it comes, as "summarized" does.
Display = Literal["summarized", "omitted", "updates"] | None


class _Thinking(Struct, frozen=True, tag_field="type"):
    pass


class ThinkingEnabled(_Thinking, frozen=True, tag="enabled"):
    # The thinking is closed after this many tokens (protocols.reasoning); max_tokens still caps
    # thinking plus answer.
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
    # `effort` is guidance on how hard to think and `task_budget` on pacing across contexts:
    # a local model takes both as hints it may ignore.
    effort: str | None = None
    format: OutputFormat | None = None
    task_budget: Any = None


class Diagnostics(Struct, frozen=True):
    """Opt-in to `diagnostics.cache_miss_reason` against this key's earlier message (None: the
    first turn; see anthropic_diagnostics)."""

    previous_message_id: str | None = None


class Metadata(Struct, frozen=True):
    user_id: str | None = None


# --- context management (the context-management-2025-06-27 beta) -------------------------------


class InputTokens(Struct, frozen=True, tag_field="type", tag="input_tokens"):
    value: Count


class ToolUses(Struct, frozen=True, tag_field="type", tag="tool_uses"):
    value: Count


class ThinkingTurns(Struct, frozen=True, tag_field="type", tag="thinking_turns"):
    value: Count


class AllTurns(Struct, frozen=True, tag_field="type", tag="all"):
    pass


class _Edit(Struct, frozen=True, tag_field="type"):
    pass


class ClearToolUses(_Edit, frozen=True, kw_only=True, tag="clear_tool_uses_20250919"):
    """Past a trigger, the oldest tool results (and with `clear_tool_inputs` their calls'
    inputs) give way to a placeholder, all but the `keep` most recent."""

    trigger: InputTokens | ToolUses = InputTokens(100_000)
    keep: ToolUses = ToolUses(3)
    clear_at_least: InputTokens | None = None
    exclude_tools: list[str] | None = None
    clear_tool_inputs: bool | list[str] | None = None


class ClearThinking(_Edit, frozen=True, kw_only=True, tag="clear_thinking_20251015"):
    """Thinking blocks of all but the `keep` most recent assistant turns are dropped."""

    keep: Literal["all"] | ThinkingTurns | AllTurns = ThinkingTurns(1)


class Compact(_Edit, frozen=True, kw_only=True, tag="compact_20260112"):
    """Server-side compaction past a trigger: not built (see anthropic_context)."""

    trigger: InputTokens | None = None
    instructions: str | None = None
    pause_after_compaction: bool = False


Edit = ClearToolUses | ClearThinking | Compact


class ContextManagement(Struct, frozen=True):
    edits: list[Edit] = []


class ThreadCreate(Struct, frozen=True, tag_field="type", tag="create"):
    """Keep this conversation server-side under the reply's id (see anthropic_threads)."""


class ThreadContinue(Struct, frozen=True, tag_field="type", tag="continue"):
    """Continue the thread whose latest reply is `previous_message_id`: only new messages come."""

    previous_message_id: Annotated[str, Meta(min_length=1)]


class PromptBody(Struct, frozen=True, kw_only=True):
    """What renders the prompt: the body of POST /v1/messages/count_tokens."""

    model: str
    # A thread's `continue` may send none (the server holds the turn); render() then needs some.
    messages: list[InputMessage]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    output_format: OutputFormat | None = None  # the structured-outputs beta's spelling
    context_management: ContextManagement | None = None
    # Answer-changing fields refused until supported.
    container: Any = None
    mcp_servers: Any = None
    compaction: Any = None
    thread: ThreadCreate | ThreadContinue | None = None


class MessagesBody(PromptBody, frozen=True, kw_only=True):
    """The body of POST /v1/messages."""

    max_tokens: common.PositiveInt
    stop_sequences: common.StopList | None = None
    stream: bool | None = None
    metadata: Metadata | None = None
    diagnostics: Diagnostics | None = None
    # The current SDK no longer sends these; older clients do.
    temperature: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=0)] | None = None


MESSAGES_DECODER = msgspec.json.Decoder(MessagesBody)
COUNT_DECODER = msgspec.json.Decoder(PromptBody)
