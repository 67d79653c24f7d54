"""Which tool-call family a model gets, and that our streaming parsers agree with mlx-lm's."""

from __future__ import annotations

import importlib
import json
import pkgutil
from typing import Any

import pytest

from mlx_serve.engine.tools.formats import HERMES, LLAMA3_JSON, format_named, parser_names, tool_format_for
from mlx_serve.engine.tools.splitter import ToolCallSplitter
from mlx_serve.engine.types import TextDelta, ToolCallArgsDelta, ToolCallStart
from tests.engine.tools.tool_outputs import RECORDED, Recorded

LLAMA32_TEMPLATE = (
    "{%- for message in messages %}{%- if 'tool_calls' in message %}"
    "{%- set tool_call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
    "{{- '{\"name\": \"' + tool_call.name + '\", ' }}{{- '\"parameters\": ' }}"
    '{{- tool_call.arguments | tojson }}{{- "}" }}{%- endif %}{%- endfor %}'
)


class Wrapper:
    """What mlx-lm's TokenizerWrapper exposes once it has inferred a family (or none)."""

    def __init__(self, family: str | None = None, chat_template: str | None = None) -> None:
        self.chat_template = chat_template
        self.tool_call_start = self.tool_call_end = self.tool_parser = None
        if family is not None:
            module = importlib.import_module(f"mlx_lm.tool_parsers.{family}")
            self.tool_call_start, self.tool_call_end = module.tool_call_start, module.tool_call_end
            self.tool_parser = module.parse_tool_call


def calls_of(fmt: Any, case: Recorded) -> list[tuple[str, Any]]:
    splitter = ToolCallSplitter(fmt, case.tools)
    events = [e for piece in case.output for e in splitter.feed(piece)] + splitter.close()
    names = {e.index: e.name for e in events if isinstance(e, ToolCallStart)}
    args = {
        i: "".join(e.arguments for e in events if isinstance(e, ToolCallArgsDelta) and e.index == i)
        for i in names
    }
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == case.text
    return [(names[i], json.loads(args[i])) for i in sorted(names)]


MLX_LM_CASES = [c for c in RECORDED if c.family not in ("hermes", "llama3_json")]


@pytest.mark.parametrize("case", MLX_LM_CASES, ids=lambda c: c.id)
def test_tool_format_inferred_by_mlx_lm_parses_its_family(case: Recorded) -> None:
    assert calls_of(tool_format_for(Wrapper(case.family)), case) == list(case.calls)


# mlx-lm has no llama 3 parser, and its strict json.loads refuses a raw newline in a string.
AGREED_CASES = [c for c in RECORDED if c.family != "llama3_json" and c.id != "hermes-raw-newline-in-string"]


@pytest.mark.parametrize("case", AGREED_CASES, ids=lambda c: c.id)
def test_tool_format_streamed_calls_equal_mlx_lms_own_parse(case: Recorded) -> None:
    family = "json_tools" if case.family == "hermes" else case.family
    module = importlib.import_module(f"mlx_lm.tool_parsers.{family}")
    want: list[tuple[str, Any]] = []
    for body in case.output.split(module.tool_call_start)[1:]:
        body = body.split(module.tool_call_end)[0] if module.tool_call_end else body
        parsed = module.parse_tool_call(body, list(case.tools))
        for one in parsed if isinstance(parsed, list) else [parsed]:
            args = one.get("arguments", {})
            want.append((one["name"], json.loads(args) if isinstance(args, str) else args))
    assert calls_of(format_named(family), case) == want


def test_tool_format_named_overrides_what_mlx_lm_infers() -> None:
    assert tool_format_for(Wrapper("qwen3_coder"), "mistral").start == "[TOOL_CALLS]"
    assert tool_format_for(Wrapper("qwen3_coder"), "hermes") is HERMES


def test_tool_format_falls_back_to_llama3_json_or_hermes_by_template() -> None:
    assert tool_format_for(Wrapper(chat_template=LLAMA32_TEMPLATE)) is LLAMA3_JSON
    assert tool_format_for(Wrapper(chat_template="{{ messages }}")) is HERMES
    assert tool_format_for(object()) is HERMES


def test_tool_format_names_are_mlx_lms_parsers_and_ours() -> None:
    import mlx_lm.tool_parsers as parsers

    theirs = {m.name for m in pkgutil.iter_modules(parsers.__path__)}
    assert set(parser_names()) == theirs | {"hermes", "llama3_json"}


@pytest.mark.parametrize("name", parser_names())
def test_tool_format_every_name_loads_a_family_with_markers(name: str) -> None:
    fmt = format_named(name)
    assert fmt.name == name and fmt.start
    fmt.body([])  # a parser for one call's markup can be made for it
