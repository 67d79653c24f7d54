"""Responses input items: what a request sends (or a stored response holds), typed, and the
chat-template conversation they make.

Messages of every role, function calls (a namespaced one under its flattened name) and their
outputs, custom (freeform) tool calls and their outputs, reasoning, and compaction items.
`encrypted_content` that this server wrote (reasoning kept for `store: false` clients, a
compaction's summary) is opaque to clients and read back here; another provider's cannot be
read: reasoning then counts as redacted, a compaction item is refused by name.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any, Literal

import msgspec
from msgspec import Struct

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.protocols import conversation as conv
from mlx_serve.protocols import openai_common as common
from mlx_serve.protocols.conversation import TemplateConversation

OPAQUE_PREFIX = "mlx-serve:1:"
SUMMARY_HEADING = "A summary of the earlier conversation, which was compacted:"


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
    """An input item; `type` defaults to "message" as the API allows. Ids and statuses the
    client echoes back are not needed and not read."""


class MessageItem(_Item, frozen=True, tag="message"):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]


class FunctionCallItem(_Item, frozen=True, tag="function_call"):
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None


class FunctionCallOutputItem(_Item, frozen=True, tag="function_call_output"):
    output: str | list[Part]
    call_id: str | None = None


class CustomToolCallItem(_Item, frozen=True, tag="custom_tool_call"):
    call_id: str
    name: str
    input: str
    namespace: str | None = None


class CustomToolCallOutputItem(_Item, frozen=True, tag="custom_tool_call_output"):
    output: str | list[Part]
    call_id: str | None = None


class ReasoningText(Struct, frozen=True):
    text: str


class ReasoningItem(_Item, frozen=True, tag="reasoning"):
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None


class CompactionItem(_Item, frozen=True, tag="compaction"):
    encrypted_content: str


class ItemReference(_Item, frozen=True, tag="item_reference"):
    id: str


InputItem = (
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | CustomToolCallItem
    | CustomToolCallOutputItem
    | ReasoningItem
    | CompactionItem
)
AnyItem = InputItem | ItemReference
# How a tool the API names (name, namespace) is called in the model's prompt.
ModelName = Callable[[str, str | None], str]


def opaque(text: str) -> str:
    """Text a client must send back untouched: base64 behind this server's prefix. Not secret:
    it is what lets a `store: false` client replay reasoning and summaries."""
    return OPAQUE_PREFIX + base64.b64encode(text.encode()).decode()


def unwrap(blob: str | None) -> str | None:
    """The text inside `opaque(text)`; None for anything this server did not write."""
    if not blob or not blob.startswith(OPAQUE_PREFIX):
        return None
    try:
        return base64.b64decode(blob[len(OPAQUE_PREFIX) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None


def input_items(raw: str | list[dict[str, Any]] | None) -> tuple[AnyItem, ...]:
    """`input` as typed items: a string is one user message."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (MessageItem(role="user", content=raw),)
    return tuple(_item(one, f"input[{i}]") for i, one in enumerate(raw))


def _item(raw: dict[str, Any], path: str) -> AnyItem:
    kind = raw.get("type")
    if kind is None:  # an item reference may leave out its type; a message may too
        kind = "item_reference" if "id" in raw and "role" not in raw else "message"
    try:
        item: AnyItem = msgspec.convert({**raw, "type": kind}, AnyItem)
    except msgspec.ValidationError as exc:
        raise common.invalid_at(exc, path) from exc
    return item


def as_item(raw: dict[str, Any]) -> InputItem:
    """One of our own output items, as the conversation keeps it."""
    item: InputItem = msgspec.convert(raw, InputItem)
    return item


def template_messages(
    instructions: str | None, items: tuple[InputItem, ...], model_name: ModelName, first_new: int = 0
) -> list[dict[str, Any]]:
    """Instructions plus the conversation as chat-template message dicts; items before
    `first_new` come from the store."""
    turns = TemplateConversation()
    if instructions:
        turns.system(instructions)
    for i, item in enumerate(items):
        _add_item(turns, item, f"input[{i - first_new}]", i < first_new, model_name)
    return turns.messages()


def _add_item(
    turns: TemplateConversation, item: InputItem, path: str, stored: bool, model_name: ModelName
) -> None:
    if isinstance(item, MessageItem):
        text = _text(item.content, f"{path}.content")
        add = {"user": turns.user, "assistant": turns.assistant}.get(item.role, turns.system)
        add(text)
    elif isinstance(item, FunctionCallItem):
        name = model_name(item.name, item.namespace)
        turns.tool_call(item.call_id, name, _arguments(item.arguments, path, stored))
    elif isinstance(item, CustomToolCallItem):
        turns.tool_call(item.call_id, model_name(item.name, item.namespace), {"input": item.input})
    elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
        turns.tool_result(item.call_id, _text(item.output, f"{path}.output"))
    elif isinstance(item, ReasoningItem):
        thought = reasoning_text(item)
        if thought:
            turns.reasoning(thought)
    else:
        turns.user(f"{SUMMARY_HEADING}\n{_summary(item, path)}")


def reasoning_text(item: ReasoningItem) -> str:
    """The thought of a reasoning item: its content, else its summary, else what this server
    kept in `encrypted_content` (clients replay reasoning with `content: null`)."""
    parts = item.content or item.summary
    if parts:
        return conv.join_text([p.text for p in parts])
    return unwrap(item.encrypted_content) or ""


def _summary(item: CompactionItem, path: str) -> str:
    summary = unwrap(item.encrypted_content)
    if summary is None:
        raise InvalidRequest(
            "this compaction item was not made by this server, and its content cannot be read",
            param=f"{path}.encrypted_content",
        )
    return summary


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
