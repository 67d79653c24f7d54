"""Tool calls split out of recorded model outputs, however the text is cut into pieces."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest

from mlx_serve.engine.tools.formats import HERMES, ToolFormat, format_named
from mlx_serve.engine.tools.splitter import ToolCallSplitter
from mlx_serve.engine.types import Delta, TextDelta, ToolCallArgsDelta, ToolCallStart
from tests.engine.tools.tool_outputs import NOT_CALLS, RECORDED, WEATHER, Recorded


@dataclass
class Run:
    """What a client would assemble from one run, and when (in pieces fed) things came out."""

    events: list[tuple[int, Delta]]

    @property
    def text(self) -> str:
        return "".join(e.text for _, e in self.events if isinstance(e, TextDelta))

    @property
    def starts(self) -> list[tuple[int, ToolCallStart]]:
        return [(n, e) for n, e in self.events if isinstance(e, ToolCallStart)]

    def arguments(self, index: int) -> list[tuple[int, str]]:
        return [
            (n, e.arguments) for n, e in self.events if isinstance(e, ToolCallArgsDelta) and e.index == index
        ]

    @property
    def calls(self) -> list[tuple[str, object]]:
        return [(e.name, json.loads("".join(a for _, a in self.arguments(e.index)))) for _, e in self.starts]


def run(fmt: ToolFormat, pieces: list[str], tools: tuple[dict[str, object], ...] = (WEATHER,)) -> Run:
    splitter = ToolCallSplitter(fmt, tools)
    events = [(n, e) for n, piece in enumerate(pieces) for e in splitter.feed(piece)]
    events += [(len(pieces), e) for e in splitter.close()]
    assert splitter.calls == len([e for _, e in events if isinstance(e, ToolCallStart)])
    return Run(events)


def splits(text: str, seed: int = 0) -> list[list[str]]:
    """Whole, cut at every character boundary, one character at a time, and 20 random
    token-like cuttings (1-8 characters a piece)."""
    out = [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    rng = random.Random(seed)
    for _ in range(20):
        pieces, i = [], 0
        while i < len(text):
            n = rng.randint(1, 8)
            pieces.append(text[i : i + n])
            i += n
        out.append(pieces)
    return out


def fmt_of(family: str) -> ToolFormat:
    return HERMES if family == "hermes" else format_named(family)


def assert_well_formed(r: Run) -> None:
    """Indexes 0, 1, … in order; unique ids; a call's arguments only after its start."""
    starts = r.starts
    assert [e.index for _, e in starts] == list(range(len(starts)))
    assert len({e.id for _, e in starts}) == len(starts)
    seen: set[int] = set()
    for _, e in r.events:
        if isinstance(e, ToolCallStart):
            seen.add(e.index)
        elif isinstance(e, ToolCallArgsDelta):
            assert e.index in seen and e.arguments


@pytest.mark.parametrize("case", RECORDED, ids=lambda c: c.id)
def test_tool_calls_same_calls_and_text_however_the_output_is_cut(case: Recorded) -> None:
    fmt = fmt_of(case.family)
    for n, pieces in enumerate(splits(case.output)):
        r = run(fmt, pieces, case.tools)
        assert (r.text, r.calls) == (case.text, list(case.calls)), (n, pieces)
        assert_well_formed(r)


@pytest.mark.parametrize("case", RECORDED, ids=lambda c: c.id)
def test_tool_calls_never_leak_markup_into_text(case: Recorded) -> None:
    fmt = fmt_of(case.family)
    markers = [m for m in (fmt.start, fmt.end, "<function=", "[ARGS]", '"name"') if m]
    r = run(fmt, list(case.output), case.tools)
    for _, e in r.events:
        if isinstance(e, TextDelta):
            assert not any(m in e.text for m in markers), e.text
            assert e.text in case.text


@pytest.mark.parametrize("case", [c for c in RECORDED if c.streams], ids=lambda c: c.id)
def test_tool_calls_stream_the_name_early_and_the_arguments_in_pieces(case: Recorded) -> None:
    r = run(fmt_of(case.family), list(case.output), case.tools)
    for at, start in r.starts:
        pieces = r.arguments(start.index)
        last = pieces[-1][0]  # the character that completed the arguments
        assert at < last, "the call started only when its arguments were whole"
        assert len(pieces) > 3 and pieces[0][0] < last


def test_tool_calls_string_arguments_pass_through_decoded() -> None:
    r = run(HERMES, ['<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'])
    assert [a for _, a in r.arguments(0)] == ['{"a": 1}']


@pytest.mark.parametrize(("family", "output"), NOT_CALLS)
def test_tool_calls_markup_that_is_not_a_call_stays_text(family: str, output: str) -> None:
    fmt = fmt_of(family)
    for pieces in splits(output):
        r = run(fmt, pieces)
        assert (r.text, r.calls) == (output, []), pieces


def test_tool_calls_broken_after_the_name_keep_the_call_and_drop_the_rest() -> None:
    output = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris" oops}}</tool_call> Bye.'
    for pieces in splits(output):
        r = run(HERMES, pieces)
        assert r.text == "Sure.  Bye." and [e.name for _, e in r.starts] == ["get_weather"]
        assert "".join(a for _, a in r.arguments(0)).startswith('{"city": "Paris"')


def test_tool_calls_cut_short_keep_the_arguments_written_so_far() -> None:
    cut = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    r = run(HERMES, list(cut))
    assert r.text == "Sure. " and [e.name for _, e in r.starts] == ["get_weather"]
    assert "".join(a for _, a in r.arguments(0)) == '{"city": "Par'


def test_tool_calls_cut_before_any_argument_get_an_empty_object() -> None:
    for family, cut in [
        ("hermes", '<tool_call>{"name": "get_weather"'),
        ("qwen3_coder", "<tool_call>\n<function=get_weather>\n"),
    ]:
        assert run(fmt_of(family), list(cut)).calls == [("get_weather", {})]


def test_tool_calls_unterminated_call_still_parses_at_the_end() -> None:
    output = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
    assert run(HERMES, [output]).calls == [("get_weather", {"city": "Paris"})]


def test_tool_calls_continue_their_index_across_markup_blocks() -> None:
    one = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    splitter = ToolCallSplitter(HERMES, (WEATHER,))
    first = [e for e in splitter.feed(one) if isinstance(e, ToolCallStart)]
    other = one.replace("Paris", "Rome")
    second = [e for e in splitter.feed("text " + other) + splitter.close() if isinstance(e, ToolCallStart)]
    assert [e.index for e in first + second] == [0, 1]


def test_tool_calls_whitespace_after_a_call_is_layout_unless_text_follows() -> None:
    one = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    for tail in ["\n", "\n\n" + one + "\n"]:
        assert run(HERMES, list(one + tail)).text == ""
    assert run(HERMES, list(one + "\n\nDone.")).text == "\n\nDone."
    broken = "\n<tool_call>not json</tool_call>"
    assert run(HERMES, list(one + broken)).text == broken
