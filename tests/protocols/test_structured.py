"""The grammar builders' refusals: each is a 400 naming the field, with llguidance's message.

What the grammars accept is checked over a real tokenizer in tests/engine/rows/test_grammar.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.protocols import structured

TOOL: Any = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("build", "says"),
    [
        (
            lambda: structured.json_schema({"properties": {"a": {"$ref": "#/$defs/gone"}}}, "p"),
            "invalid JSON schema: Pointer '/$defs/gone' does not exist",
        ),
        (
            lambda: structured.json_schema({"type": "object", "minProperties": 3, "maxProperties": 1}, "p"),
            "Unsatisfiable schema",
        ),
        (lambda: structured.json_schema([1], "p"), "a JSON schema must be an object"),
        (lambda: structured.regex("(?<", "p"), "invalid regex"),
        (lambda: structured.choice(["a", 1], "p"), "a choice needs a non-empty list of strings"),
        (
            lambda: structured.grammar('root ::= "a" [0-9+', "p"),
            "Failed to convert the grammar from GBNF to Lark",
        ),
        (lambda: structured.grammar('start: "a" | "b', "p"), "lexer error"),
    ],
)
def test_builders_refuse_what_does_not_compile(build: Callable[[], str], says: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        build()
    assert info.value.param == "p" and says in info.value.message and info.value.status == 400


def test_forced_calls_refuses_a_tool_schema_that_does_not_compile() -> None:
    bad = {"type": "function", "function": {"name": "g", "parameters": {"type": "nope"}}}
    with pytest.raises(InvalidRequest) as info:
        structured.forced_calls([TOOL, bad], None, True, True)
    assert info.value.param == "tools"
    assert "invalid tool parameters schema" in info.value.message and "nope" in info.value.message


def test_forced_calls_is_none_unless_the_choice_forces_a_call() -> None:
    assert structured.forced_calls([TOOL], None, False, True) is None
    assert structured.forced_calls(None, None, False, True) is None


def test_pick_takes_the_one_grammar_given() -> None:
    assert structured.pick("calls", None, "p") == structured.Constraint("calls", True)
    assert structured.pick(None, "json", "p") == structured.Constraint("json", False)
    assert structured.pick(None, None, "p") == structured.Constraint(None, False)


def test_pick_lets_forced_calls_win_over_a_format_with_a_warning() -> None:
    constraint = structured.pick("calls", "json", "text.format")
    assert (constraint.grammar, constraint.forced) == ("calls", True)
    assert len(constraint.warnings) == 1 and constraint.warnings[0].startswith(
        '299 - "`text.format` did not apply'
    )
