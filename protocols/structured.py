"""Structured output and forced tool calls as llguidance grammars, shared by every format.

Each format maps its own fields (response_format, text.format, output_config.format, vLLM's
structured_outputs and guided_*, tool_choice) onto these builders. Every grammar is compiled
and checked here, so one that does not compile is a 400 carrying llguidance's message before
anything is generated; what reaches the engine is the grammar's text.

JSON comes out on one line in `json.dumps` style (`{"a": 1, "b": [2, 3]}`): bounded
whitespace keeps a small model from padding forever. A schema's own `x-guidance` options win.
A forced tool call is written in hermes markup whatever the model family,
`<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>`, each tool's parameters a schema
of its own (so its `$ref`s keep their root); the engine parses it with the same markers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llguidance import LLMatcher, grammar_from

from mlx_serve.engine.errors import InvalidRequest, grammar_message
from mlx_serve.engine.tools.formats import HERMES
from mlx_serve.protocols.conversation import warning

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

JSON_STYLE: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


# Checked before anything is compiled: llguidance's validation grows faster than linearly with
# an alternation's width, and one parser row holds at most 2,000 items (a wider choice fails a
# token into the answer), so a 100,000-item choice is refused unread, not compiled for minutes.
MAX_CHOICE_ITEMS = 1000
MAX_GRAMMAR_CHARS = 256 * 1024  # a regex, grammar, choice list or JSON schema, as text


def bounded(text: str, param: str, what: str) -> str:
    if len(text) > MAX_GRAMMAR_CHARS:
        raise InvalidRequest(
            f"the {what} is {len(text)} characters; at most {MAX_GRAMMAR_CHARS} are taken", param=param
        )
    return text


def checked(grammar: str, param: str, what: str) -> str:
    """The grammar itself, once llguidance has compiled it; its complaint is a 400."""
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise InvalidRequest(f"invalid {what}: {grammar_message(error)}", param=param)
    return grammar


def json_schema(schema: Any, param: str) -> str:
    """One JSON value valid against `schema`: a dict, or its JSON text (vLLM's guided_json);
    None is any JSON object."""
    if schema is None:
        schema = ANY_OBJECT
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"invalid JSON schema: not JSON: {exc}", param=param) from exc
    if not isinstance(schema, dict | bool):
        raise InvalidRequest("a JSON schema must be an object", param=param)
    # A boolean schema goes as its JSON text: the same grammar, and the type llguidance declares.
    text = schema if isinstance(schema, dict) else json.dumps(schema)
    bounded(json.dumps(schema), param, "JSON schema")
    return checked(LLMatcher.grammar_from_json_schema(text, defaults=JSON_STYLE), param, "JSON schema")


def regex(pattern: str, param: str) -> str:
    return checked(LLMatcher.grammar_from_regex(bounded(pattern, param, "regex")), param, "regex")


def choice(options: Sequence[str], param: str) -> str:
    """Exactly one of `options`, verbatim."""
    if not options or not all(isinstance(o, str) for o in options):
        raise InvalidRequest("a choice needs a non-empty list of strings", param=param)
    if len(options) > MAX_CHOICE_ITEMS:
        raise InvalidRequest(
            f"a choice of {len(options)} options; at most {MAX_CHOICE_ITEMS} are taken", param=param
        )
    bounded("".join(options), param, "choice list")
    return checked(
        LLMatcher.grammar_from_lark("start: " + " | ".join(map(json.dumps, options))), param, "choice"
    )


def grammar(text: str, param: str) -> str:
    """A Lark grammar (llguidance's dialect) or a GBNF one, as vLLM's guided_grammar takes."""
    bounded(text, param, "grammar")
    try:
        compiled = grammar_from("grammar", text)
    except ValueError as exc:
        raise InvalidRequest(f"invalid grammar: {exc}", param=param) from exc
    return checked(compiled, param, "grammar")


def forced_calls(
    tools: Sequence[dict[str, Any]] | None, name: str | None, required: bool, parallel: bool
) -> str | None:
    """The grammar of a tool_choice that forces calls, or None when it does not: only calls to
    the function `name` (exactly one), or to any of `tools` when `required` (with `parallel`,
    one or more). `tools` are OpenAI-shaped: {"function": {"name", "parameters"}}."""
    if name is None and not required:
        return None
    tools = tools or []
    functions = [t["function"] for t in tools]
    if name is not None:
        functions = [f for f in functions if f["name"] == name]
        if not functions:
            offered = ", ".join(repr(t["function"]["name"]) for t in tools)
            raise InvalidRequest(
                f"`tool_choice` names the function {name!r}, which is not "
                f"among the tools offered ({offered or 'none'})",
                param="tool_choice",
            )
    if not functions:
        raise InvalidRequest("`tool_choice` forces a tool call but no tools are offered", param="tool_choice")
    # Calls follow one another directly: anything between them would reach the client as text.
    return _calls_grammar(functions, "call+" if parallel and name is None else "call")


def allowed_calls(tools: Sequence[dict[str, Any]], parallel: bool) -> str:
    """The grammar of an answer that may call only `tools` (Open Responses' `allowed_tools` in
    `auto` mode): text without any call markup, then calls to those tools, or none."""
    if not tools:
        raise InvalidRequest("`tool_choice.tools` names none of the tools offered", param="tool_choice.tools")
    return _calls_grammar(
        [t["function"] for t in tools], "TEXT call*" if parallel else "TEXT call?", text=True
    )


def _calls_grammar(functions: list[dict[str, Any]], start: str, text: bool = False) -> str:
    rules = [_call_rule(i, f) for i, f in enumerate(functions)]
    marker = json.dumps(HERMES.start)[1:-1]
    lark = "\n".join(
        [
            f"start: {start}",
            *([f"TEXT: /(?s:.*)/ & ~/(?s:.*{re.escape(marker)}.*)/"] if text else []),
            f"call: {json.dumps(HERMES.start + chr(10))} body {json.dumps(chr(10) + HERMES.end)}",
            "body: " + " | ".join(f"call_{i}" for i in range(len(rules))),
            *rules,
        ]
    )
    return checked(LLMatcher.grammar_from_lark(lark), "tools", "tool parameters schema")


@dataclass(frozen=True, slots=True)
class Constraint:
    """The one grammar a request follows, whether it forces tool calls, and the notes owed to
    the client about what did not apply."""

    grammar: str | None = None
    forced: bool = False
    warnings: tuple[str, ...] = ()


def pick(calls: str | None, output: str | None, param: str) -> Constraint:
    """A tool choice that constrains calls wins over an output format, as OpenAI does: a forced
    call's arguments follow its tool's schema (instructor's tools modes send both); the format
    is left out with a `Warning` naming it."""
    if calls is None:
        return Constraint(output)
    if output is None:
        return Constraint(calls, True)
    note = warning(
        f"`{param}` did not apply: `tool_choice` constrains the answer to tool calls, whose "
        "arguments follow each tool's parameters schema"
    )
    return Constraint(calls, True, (note,))


def _call_rule(i: int, function: dict[str, Any]) -> str:
    head = '{"name": ' + json.dumps(function["name"], ensure_ascii=False) + ', "arguments": '
    parameters = function.get("parameters") or NO_PARAMETERS
    guidance = parameters.get("x-guidance", {})
    if not isinstance(guidance, dict):
        raise InvalidRequest(
            f"tool {function['name']!r}: `x-guidance` in its parameters must be an object of llguidance "
            "options",
            param="tools",
        )
    schema = {**parameters, "x-guidance": {**JSON_STYLE, **guidance}}
    return f'call_{i}: {json.dumps(head)} %json {json.dumps(schema)} "}}"'
