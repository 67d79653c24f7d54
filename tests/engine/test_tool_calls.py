from __future__ import annotations

import json

from engine.tool_calls import ToolCallSplitter
from engine.tool_formats import HERMES, ToolFormat, tool_format_for
from engine.types import Delta, TextDelta, ToolCallArgsDelta, ToolCallStart

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
OUTPUT = "Let me check. " + CALL + CALL.replace("Paris", "Lyon") + " Done."


def run(pieces: list[str], fmt: ToolFormat = HERMES) -> tuple[str, list[tuple[str, dict[str, str]]]]:
    splitter = ToolCallSplitter(fmt)
    events: list[Delta] = []
    for piece in pieces:
        events += splitter.feed(piece)
    events += splitter.close()
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    names = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
    args: dict[int, str] = {}
    for e in events:
        if isinstance(e, ToolCallArgsDelta):
            args[e.index] = args.get(e.index, "") + e.arguments
    assert splitter.calls == len(names)
    return text, [(names[i], json.loads(args[i])) for i in sorted(names)]


def test_tool_calls_split_from_text_at_every_boundary() -> None:
    want = ("Let me check.  Done.", [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Lyon"})])
    for i in range(len(OUTPUT) + 1):
        for j in range(i, len(OUTPUT) + 1, 7):
            assert run([OUTPUT[:i], OUTPUT[i:j], OUTPUT[j:]]) == want, (i, j)


def test_tool_calls_one_character_at_a_time_never_leak_markup() -> None:
    splitter = ToolCallSplitter(HERMES)
    for ch in OUTPUT:
        for e in splitter.feed(ch):
            assert not isinstance(e, TextDelta) or "<" not in e.text


def test_tool_calls_bad_markup_falls_back_to_text() -> None:
    bad = "a <tool_call>not json</tool_call> b"
    assert run([bad]) == (bad, [])


def test_tool_calls_unterminated_call_still_parses_at_the_end() -> None:
    assert run([CALL.removesuffix("</tool_call>")]) == ("", [("get_weather", {"city": "Paris"})])


def test_tool_calls_text_that_only_looks_like_a_marker_is_released() -> None:
    assert run(["x <tool", "_cal", "m"]) == ("x <tool_calm", [])


def test_tool_calls_string_arguments_pass_through() -> None:
    text, calls = run(['<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'])
    assert (text, calls) == ("", [("f", {"a": 1})])


def test_tool_format_comes_from_mlx_lm_when_the_template_names_one() -> None:
    class Wrapper:
        tool_call_start, tool_call_end = "[TOOL_CALLS]", "[/TOOL_CALLS]"

        @staticmethod
        def tool_parser(text: str, tools: object) -> dict[str, object]:
            return {"name": "x", "arguments": {}}

    assert tool_format_for(Wrapper()).start == "[TOOL_CALLS]"
    assert tool_format_for(object()) is HERMES
