"""Model families' tool-call markup: which markers, and which parser reads what is inside.

The family is the one mlx-lm infers from the chat template (`TokenizerWrapper.tool_parser`,
one module of `mlx_lm.tool_parsers`), or the one `--tool-call-parser` names. Ours on top:
`hermes` (`<tool_call>{"name", "arguments"}</tool_call>`, the fallback when nothing is
inferred) and `llama3_json` (Llama 3.1+ calls: bare `{"name", "parameters"}` JSON opening
the answer, or after `<|python_tag|>`), and `qwen2_5` for Qwen2.5 templates (hermes markup,
but a call may also open the answer as bare JSON: the Qwen2.5-Coder models write their calls
that way and never emit `<tool_call>`). JSON families and qwen3-coder's XML stream their
arguments; the other families' calls go out whole, parsed by mlx-lm, at their end marker.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlx_serve.engine.tools.json_calls import JsonCalls, tool_names
from mlx_serve.engine.tools.sink import BodyParser, CallSink, NotACall
from mlx_serve.engine.tools.xml_calls import XmlCalls

Parse = Callable[[str, Any], Any]
MLX_LM_PARSERS = "mlx_lm.tool_parsers"
OUR_PARSERS = ("hermes", "llama3_json")


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """A family's markers and how to read one call's markup, given the offered tools.

    An empty `end` means the markup ends where its parser says (or with the generation);
    `bare_json` lets a call also open the answer with no start marker at all.
    """

    name: str
    start: str
    end: str
    body: Callable[[Any], BodyParser]
    bare_json: bool = False


@dataclass(slots=True)
class WholeCalls:
    """A BodyParser for families read whole: mlx-lm's parser runs at the end of the markup."""

    parse: Parse
    tools: Any = None
    started: bool = False
    _text: list[str] = field(default_factory=list)

    def feed(self, text: str, sink: CallSink) -> int | None:
        self._text.append(text)
        return None

    def close(self, sink: CallSink) -> None:
        for name, arguments, call_id in parsed_calls(self.parse, "".join(self._text), self.tools):
            sink.args(sink.start(name, call_id), arguments)
            self.started = True


def parsed_calls(parse: Parse, text: str, tools: Any) -> list[tuple[str, str, str | None]]:
    """(name, arguments JSON, the model's own call id if it wrote one) per call; NotACall
    when the parser fails or returns something that is not calls."""
    try:
        parsed = parse(text, tools)
    except Exception as exc:
        raise NotACall(str(exc)) from exc
    calls = []
    for item in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise NotACall(f"not a tool call: {item!r}")
        args = item.get("arguments", item.get("parameters", {}))
        call_id = item.get("id") if isinstance(item.get("id"), str) else None
        calls.append((item["name"], args if isinstance(args, str) else json.dumps(args), call_id))
    if not calls:
        raise NotACall("no tool call in the markup")
    return calls


HERMES = ToolFormat("hermes", "<tool_call>", "</tool_call>", lambda tools: JsonCalls())
# A bare call counts only when it names an offered tool (any JSON answer could look like one);
# text after a bare call in the same answer is dropped like junk inside markers.
QWEN2_5 = ToolFormat(
    "qwen2_5", "<tool_call>", "</tool_call>", lambda tools: JsonCalls(names=tool_names(tools)), bare_json=True
)
LLAMA3_JSON = ToolFormat(
    "llama3_json", "<|python_tag|>", "", lambda tools: JsonCalls(names=tool_names(tools)), bare_json=True
)


def parser_names() -> list[str]:
    """What `--tool-call-parser` accepts: mlx-lm's parser modules and ours (no import of mlx)."""
    spec = importlib.util.find_spec("mlx_lm")
    found: list[str] = []
    if spec is not None and spec.origin is not None:
        folder = Path(spec.origin).parent / "tool_parsers"
        found = [m.name for m in pkgutil.iter_modules([str(folder)])]
    return sorted({*found, *OUR_PARSERS})


def format_named(name: str) -> ToolFormat:
    """The family `--tool-call-parser NAME` asks for."""
    if name == HERMES.name:
        return HERMES
    if name == LLAMA3_JSON.name:
        return LLAMA3_JSON
    module = importlib.import_module(f"{MLX_LM_PARSERS}.{name}")
    return _family(name, module.tool_call_start, module.tool_call_end, module.parse_tool_call)


def tool_format_for(tokenizer: Any, name: str | None = None) -> ToolFormat:
    """The named family, else the one mlx-lm infers for the tokenizer (Qwen2.5's for its
    templates), else llama 3's when the chat template writes llama 3 calls, else hermes JSON."""
    if name:
        return format_named(name)
    start, end = getattr(tokenizer, "tool_call_start", None), getattr(tokenizer, "tool_call_end", None)
    parse = getattr(tokenizer, "tool_parser", None)
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    if start and end is not None and parse is not None:
        family = str(getattr(parse, "__module__", "")).rpartition(".")[2]
        if family == "json_tools" and _is_qwen2_5(template):
            return QWEN2_5
        return _family(family, start, end, parse)
    return LLAMA3_JSON if _writes_llama3_calls(template) else HERMES


def _is_qwen2_5(template: str) -> bool:
    # Qwen2.5's default system prompt; Qwen3's templates, whose models write the markup, lack it.
    return "You are Qwen, created by Alibaba Cloud." in template and "<tool_response>" in template


def _writes_llama3_calls(template: str) -> bool:
    # Llama 3.1-3.3 templates render a past call as {"name": …, "parameters": …} in a header turn.
    return all(mark in template for mark in ("<|start_header_id|>", "tool_call.name", '"parameters"'))


def _family(name: str, start: str, end: str, parse: Parse) -> ToolFormat:
    if name == "json_tools":
        return ToolFormat(name, start, end, lambda tools: JsonCalls())
    if name == "mistral":
        return ToolFormat(name, start, end, lambda tools: JsonCalls(headers=True))
    if name == "qwen3_coder":
        return ToolFormat(name, start, end, lambda tools: XmlCalls(parse, tools))
    return ToolFormat(name, start, end, lambda tools: WholeCalls(parse, tools))
