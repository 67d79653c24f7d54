"""Qwen2.5's tool calls: hermes markup, or bare JSON opening the answer (how Qwen2.5-Coder writes them)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mlx_serve.engine.tools.formats import QWEN2_5, tool_format_for
from mlx_serve.engine.tools.splitter import ToolCallSplitter
from mlx_serve.engine.types import TextDelta, ToolCallArgsDelta, ToolCallStart
from tests.engine.tools.test_formats import Wrapper

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
QWEN2_5_TEMPLATE = (
    "{%- if tools %}You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\\n\\n# Tools"
    "{%- elif message.role == 'tool' %}{{- '<tool_response>\\n' }}{%- endif %}"
)
QWEN3_TEMPLATE = (
    "{%- if tools %}# Tools{%- elif message.role == 'tool' %}{{- '<tool_response>\\n' }}{%- endif %}"
)


def split(pieces: list[str]) -> tuple[str, list[tuple[str, Any]]]:
    splitter = ToolCallSplitter(QWEN2_5, TOOLS)
    events = [e for piece in pieces for e in splitter.feed(piece)] + splitter.close()
    names = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
    args = {i: "".join(e.arguments for e in events if isinstance(e, ToolCallArgsDelta) and e.index == i)
            for i in names}  # fmt: skip
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return text, [(names[i], json.loads(args[i])) for i in sorted(names)]


def test_tool_format_for_a_qwen2_5_template_is_qwen2_5() -> None:
    assert tool_format_for(Wrapper("json_tools", QWEN2_5_TEMPLATE)) is QWEN2_5
    assert tool_format_for(Wrapper("json_tools", QWEN3_TEMPLATE)).name == "json_tools"
    assert tool_format_for(Wrapper("json_tools", QWEN2_5_TEMPLATE), "hermes").name == "hermes"


@pytest.mark.parametrize(
    "pieces",
    [
        ['{"name": "get_', 'weather", "arguments": {"city": ', '"Paris"}}'],  # what Qwen2.5-Coder writes
        ["\n", '{"name": "get_weather", "arguments": {"city": "Paris"}}'],
        ['<tool_call>\n{"name": "get_weather", ', '"arguments": {"city": "Paris"}}\n</tool_call>'],
        # In a fence, as Qwen2.5-Coder-0.5B writes it under Codex: the fence is not text.
        ["``", "`json\n", '{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'],
        ['```\n  {"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n'],
        ["```JSON", "\n", "\n", '{"name": "get_weather", "arguments": {"city": "Paris"}}```'],
    ],
)
def test_qwen2_5_call_bare_or_in_markup(pieces: list[str]) -> None:
    assert split(pieces) == ("", [("get_weather", {"city": "Paris"})])


@pytest.mark.parametrize(
    "answer",
    [
        '{"name": "get_time", "arguments": {}}',  # not an offered tool
        '{"city": "Paris", "sky": "clear"}',  # JSON, but not a call
        'The call is {"name": "get_weather", "arguments": {}}',  # bare JSON only opens an answer
        '```json\n{"name": "get_time", "arguments": {}}\n```',  # fenced, not an offered tool
        '```python\n{"name": "get_weather", "arguments": {}}\n```',  # a fence of code, not JSON
        '```json\n["get_weather"]\n```',  # fenced JSON, but not a call
        "``not a fence",
        "```",  # the answer ends inside what could have been a fence
        'Here: ```json\n{"name": "get_weather", "arguments": {}}\n```',  # a fence only opens an answer
    ],
)
def test_qwen2_5_other_json_stays_text(answer: str) -> None:
    assert split([answer[:9], answer[9:]]) == (answer, [])


def run(pieces: list[str]) -> tuple[str, list[tuple[str, Any]], bool]:
    """The text, the calls and whether the splitter ended the answer."""
    splitter = ToolCallSplitter(QWEN2_5, TOOLS)
    events = []
    for piece in pieces:
        events += splitter.feed(piece)
    ended = splitter.ended
    events += splitter.close()
    names = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
    args = {i: "".join(e.arguments for e in events if isinstance(e, ToolCallArgsDelta) and e.index == i)
            for i in names}  # fmt: skip
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return text, [(names[i], json.loads(args[i])) for i in sorted(names)], ended


PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
ROME = '{"name": "get_weather", "arguments": {"city": "Rome"}}'


@pytest.mark.parametrize(
    "pieces",
    [
        [PARIS, "\nThe weather is nice. I will now"],  # prose after a bare call
        ["```json\n", PARIS, "\n``", "`\n", "Done! Let me know if"],  # prose after a fenced call
        [PARIS, '\n{"city": "Paris"}'],  # JSON after the calls that is not a call
        [PARIS, "</tool_call>\n", "I called it."],  # a stray end marker, then prose
    ],
)
def test_a_bare_call_ends_the_answer_at_the_first_text_after_it(pieces: list[str]) -> None:
    # A bare call has no end marker: what follows the calls would otherwise run to max_tokens.
    assert run(pieces) == ("", [("get_weather", {"city": "Paris"})], True)


@pytest.mark.parametrize(
    "pieces",
    [
        [PARIS, "\n", ROME],  # bare, one after the other
        ["```json\n", PARIS, "\n```\n```json\n", ROME, "\n```"],  # each in its own fence
        [PARIS, "\n<tool_call>\n", ROME, "\n</tool_call>"],  # then one in markup
    ],
)
def test_more_calls_after_a_bare_call_are_calls(pieces: list[str]) -> None:
    text, calls, ended = run(pieces)
    assert (text, calls) == ("", [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})])
    assert not ended  # the model may still write another call, or stop


@pytest.mark.parametrize("opening", ["", "<tool_call>\n"])
def test_the_same_call_again_ends_the_answer_without_the_repeat(opening: str) -> None:
    # Greedy small models (Qwen2.5-Coder-0.5B after a tool result) repeat their call forever;
    # a client shown the repeat would run the tool twice.
    close = "\n</tool_call>\n" if opening else "\n"
    text, calls, ended = run([opening + PARIS + close] * 2 + [opening + ROME + close])
    assert (text, calls, ended) == ("", [("get_weather", {"city": "Paris"})], True)


@pytest.mark.parametrize("opening", ["", "<tool_call>\n"])
def test_a_repeat_streamed_piece_by_piece_never_reaches_the_client(opening: str) -> None:
    close = "\n</tool_call>\n" if opening else "\n"
    splitter = ToolCallSplitter(QWEN2_5, TOOLS)
    events = [e for ch in (opening + PARIS + close) * 2 for e in splitter.feed(ch)] + splitter.close()
    assert [e.index for e in events if isinstance(e, ToolCallStart)] == [0]
    assert "".join(e.arguments for e in events if isinstance(e, ToolCallArgsDelta)) == '{"city": "Paris"}'


@pytest.mark.parametrize("cut", [len('{"name": "get_weather", "arguments": {"city": "Par'), len(PARIS)])
def test_a_call_like_an_earlier_one_goes_out_when_it_differs_or_the_answer_ends(cut: int) -> None:
    # Held back while it could be a repeat: a call to the same tool with other arguments, or
    # one cut short (max_tokens) while its arguments still match, goes out whole all the same.
    other = PARIS.replace("Paris", "Paris, Texas")
    splitter = ToolCallSplitter(QWEN2_5, TOOLS)
    events = [e for ch in PARIS + "\n" + other[:cut] for e in splitter.feed(ch)] + splitter.close()
    assert [e.index for e in events if isinstance(e, ToolCallStart)] == [0, 1]
    second = "".join(e.arguments for e in events if isinstance(e, ToolCallArgsDelta) and e.index == 1)
    assert second == other[len('{"name": "get_weather", "arguments": ') : cut].removesuffix("}")
