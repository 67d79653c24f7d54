"""Tool calls out of generated text: markup between the model family's start and end markers.

The parser is the one mlx-lm infers from the chat template (`TokenizerWrapper.tool_parser`,
with its markers); a template that names none gets the common hermes/qwen form,
`<tool_call>{"name": …, "arguments": …}</tool_call>`. Text outside the markers flows on as
text (a possible start marker split across tokens is held back, never leaked); a call is
emitted when its end marker arrives. Markup that does not parse falls back to plain text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.stops import partial_suffix_len
from engine.types import Delta, TextDelta, ToolCallArgsDelta, ToolCallStart

Parse = Callable[[str, Any], Any]


def _parse_json_call(text: str, tools: Any = None) -> Any:
    return json.loads(text.strip())


@dataclass(frozen=True, slots=True)
class ToolFormat:
    start: str
    end: str
    parse: Parse


HERMES = ToolFormat("<tool_call>", "</tool_call>", _parse_json_call)


def tool_format_for(tokenizer: Any) -> ToolFormat:
    """The model family's tool-call markup, as mlx-lm infers it; hermes JSON otherwise."""
    start, end = getattr(tokenizer, "tool_call_start", None), getattr(tokenizer, "tool_call_end", None)
    parse = getattr(tokenizer, "tool_parser", None)
    if start and end and parse is not None:
        return ToolFormat(start, end, parse)
    return HERMES


@dataclass(slots=True)
class ToolCallSplitter:
    """Feed text pieces; get back text deltas and whole tool calls, in order."""

    fmt: ToolFormat
    tools: Any = None
    calls: int = 0
    _held: str = ""
    _inside: bool = False
    _body: list[str] = field(default_factory=list)

    def feed(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        buf = self._held + text
        self._held = ""
        while buf:
            buf = self._inside_step(buf, out) if self._inside else self._outside_step(buf, out)
        return out

    def _outside_step(self, buf: str, out: list[Delta]) -> str:
        at = buf.find(self.fmt.start)
        if at == -1:
            keep = partial_suffix_len(buf, (self.fmt.start,))
            self._held = buf[len(buf) - keep:] if keep else ""
            _text(out, buf[: len(buf) - keep])
            return ""
        _text(out, buf[:at])
        self._inside = True
        return buf[at + len(self.fmt.start):]

    def _inside_step(self, buf: str, out: list[Delta]) -> str:
        at = buf.find(self.fmt.end)
        if at == -1:
            keep = partial_suffix_len(buf, (self.fmt.end,))
            self._body.append(buf[: len(buf) - keep])
            self._held = buf[len(buf) - keep:] if keep else ""
            return ""
        self._body.append(buf[:at])
        self._emit(out)
        return buf[at + len(self.fmt.end):]

    def close(self) -> list[Delta]:
        """End of generation: flush held text; an unterminated call still gets a parse."""
        out: list[Delta] = []
        if self._inside:
            self._body.append(self._held)
            self._held = ""
            self._emit(out, terminated=False)
        _text(out, self._held)
        self._held = ""
        return out

    def _emit(self, out: list[Delta], terminated: bool = True) -> None:
        body = "".join(self._body)
        self._body, self._inside = [], False
        calls = self._parse(body)
        if calls is None:  # not a call after all: the markup is text
            _text(out, self.fmt.start + body + (self.fmt.end if terminated else ""))
            return
        for name, arguments in calls:
            out.append(ToolCallStart(self.calls, f"call_{uuid.uuid4().hex[:24]}", name))
            out.append(ToolCallArgsDelta(self.calls, arguments))
            self.calls += 1

    def _parse(self, body: str) -> list[tuple[str, str]] | None:
        try:
            parsed = self.fmt.parse(body, self.tools)
        except Exception:  # noqa: BLE001 - any parser failure means "not a call"
            return None
        items = parsed if isinstance(parsed, list) else [parsed]
        calls = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return None
            args = item.get("arguments", item.get("parameters", {}))
            calls.append((item["name"], args if isinstance(args, str) else json.dumps(args)))
        return calls


def _text(out: list[Delta], text: str) -> None:
    if text:
        out.append(TextDelta(text))
