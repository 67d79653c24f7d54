"""Qwen3-Coder's XML tool calls, parsed while they stream.

    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>

The call starts when `<function=NAME>` closes. A parameter the tool's schema types as a
string (or does not describe) streams as a JSON string while it is written; any other is
converted by mlx-lm's own parser once its `</parameter>` arrives, so the values are the
ones mlx-lm would give. As in mlx-lm, one newline after the opening tag and one before the
closing tag belong to the markup, and `null` (any case) is JSON null.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any

from mlx_serve.engine.text.stops import partial_suffix_len
from mlx_serve.engine.tools.sink import CallSink, NotACall

FUNCTION, PARAMETER = "<function=", "<parameter="
END_FUNCTION, END_PARAMETER = "</function>", "</parameter>"
STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})


class _At(enum.Enum):
    FUNCTION = enum.auto()  # `<function=` comes next
    NAME = enum.auto()
    PARAMS = enum.auto()  # `<parameter=` or `</function>` comes next
    PARAM_NAME = enum.auto()
    STRING = enum.auto()  # a string value, streamed
    VALUE = enum.auto()  # another value, held until its closing tag
    AFTER = enum.auto()  # after `</function>`


@dataclass(slots=True)
class XmlCalls:
    """A BodyParser for `<function=…><parameter=…>…</parameter></function>` (one call)."""

    parse: Any  # mlx-lm's parse_tool_call for this family: converts non-string values
    tools: Any = None
    started: bool = False
    at: _At = _At.FUNCTION
    _buf: str = ""
    _index: int = -1
    _name: str = ""
    _params: int = 0
    _param: str = ""
    _value: str = ""  # a streamed string's text not yet passed on
    _opened: bool = False  # the streamed string's opening quote went out

    def feed(self, text: str, sink: CallSink) -> int | None:
        self._buf += text
        while self._step(sink):
            pass
        if self.at is _At.AFTER and self._buf.strip():
            return max(0, len(text) - len(self._buf.lstrip()))  # the call is over; the rest is not its
        return None

    def close(self, sink: CallSink) -> None:
        if not self.started:
            raise NotACall("no <function=…> in the markup")
        if self.at is not _At.AFTER and not self._params:  # cut short before any parameter
            sink.args(self._index, "{}")

    def _step(self, sink: CallSink) -> bool:
        """Move on by one piece of markup; False when more text is needed."""
        at = self.at
        if at is _At.FUNCTION:
            return self._tag(FUNCTION, _At.NAME, must=True)
        if at in (_At.NAME, _At.PARAM_NAME):
            return self._name_tag(sink)
        if at is _At.PARAMS:
            return self._tag(PARAMETER, _At.PARAM_NAME) or self._end_function(sink)
        if at is _At.STRING:
            return self._string(sink)
        if at is _At.VALUE:
            return self._converted(sink)
        return False

    def _tag(self, tag: str, then: _At, must: bool = False) -> bool:
        rest = self._buf.lstrip()
        if rest.startswith(tag):
            self._buf, self.at = rest[len(tag) :], then
            return True
        if must and rest and not tag.startswith(rest):
            raise NotACall(f"expected {tag!r}")
        return False

    def _name_tag(self, sink: CallSink) -> bool:
        at = self._buf.find(">")
        if at < 0:
            if "<" in self._buf or "\n" in self._buf.lstrip():
                raise NotACall("a function or parameter name is not closed")
            return False
        name = self._buf[:at].strip()
        if not name or any(c.isspace() or c == "<" for c in name):
            raise NotACall(f"{name!r} is not a function or parameter name")
        self._buf = self._buf[at + 1 :]
        if self.at is _At.NAME:
            self._name, self._index, self.started = name, sink.start(name), True
            self.at = _At.PARAMS
        else:
            self._begin_param(name, sink)
        return True

    def _begin_param(self, name: str, sink: CallSink) -> None:
        sink.args(self._index, ("{" if not self._params else ", ") + json.dumps(name) + ": ")
        self._params += 1
        self._param, self._value, self._opened = name, "", False
        self.at = _At.STRING if self._streams(name) else _At.VALUE

    def _end_function(self, sink: CallSink) -> bool:
        rest = self._buf.lstrip()
        if rest.startswith(END_FUNCTION):
            self._buf, self.at = rest[len(END_FUNCTION) :], _At.AFTER
            sink.args(self._index, "}" if self._params else "{}")
            return True
        if rest and not PARAMETER.startswith(rest) and not END_FUNCTION.startswith(rest):
            raise NotACall("expected a parameter or </function>")
        return False

    def _string(self, sink: CallSink) -> bool:
        self._value += self._buf
        self._buf = ""
        at = self._value.find(END_PARAMETER)
        if at >= 0:
            self._buf, self._value = self._value[at + len(END_PARAMETER) :], self._value[:at]
        raw = self._value if self._opened or self._value[:1] != "\n" else self._value[1:]
        if at >= 0:
            raw = raw.removesuffix("\n")
            if not self._opened and raw.lower() == "null":
                sink.args(self._index, "null")
            else:
                sink.args(self._index, ("" if self._opened else '"') + _escaped(raw) + '"')
            self.at = _At.PARAMS
            return True
        keep = partial_suffix_len(raw, (END_PARAMETER,))
        keep += raw[: len(raw) - keep].endswith("\n")  # may be the newline before the tag
        ready = raw[: len(raw) - keep]
        if not ready or (not self._opened and "null".startswith(ready.lower())):
            return False  # still possibly `null`, or nothing certain yet
        sink.args(self._index, ("" if self._opened else '"') + _escaped(ready))
        self._value, self._opened = raw[len(ready) :], True
        return False

    def _converted(self, sink: CallSink) -> bool:
        at = self._buf.find(END_PARAMETER)
        if at < 0:
            return False
        raw, self._buf = self._buf[:at], self._buf[at + len(END_PARAMETER) :]
        one = f"{FUNCTION}{self._name}>\n{PARAMETER}{self._param}>{raw}{END_PARAMETER}\n{END_FUNCTION}"
        try:
            value = self.parse(one, self.tools)["arguments"][self._param]
        except Exception as exc:
            raise NotACall(f"parameter {self._param!r}: {exc}") from exc
        sink.args(self._index, json.dumps(value, ensure_ascii=False))
        self.at = _At.PARAMS
        return True

    def _streams(self, param: str) -> bool:
        """Whether mlx-lm would keep this parameter's text as a string (as its schema says)."""
        for tool in self.tools or ():
            function = tool.get("function") or {}
            if function.get("name") == self._name:
                schema = (function.get("parameters") or {}).get("properties", {}).get(param)
                if not schema:
                    return True
                return "type" in schema and str(schema["type"]).strip().lower() in STRING_TYPES
        return True


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]
