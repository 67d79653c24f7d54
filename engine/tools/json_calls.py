"""Tool calls written as JSON, parsed while they stream.

One body holds one or more calls: `{"name": …, "arguments": {…}}` objects (hermes/qwen,
`parameters` for llama 3), side by side, `;`-separated or in a `[…]` list; with `headers`,
mistral's `name[ARGS]{…}` too. A call starts as soon as its name's string closes; argument
text is passed on as soon as the scanner has accepted it, so it is always a valid JSON
prefix and never anything outside the arguments. Arguments written before the name wait for
it; arguments written as a JSON string are passed on decoded, once whole.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mlx_serve.engine.tools.json_scan import JsonScanner
from mlx_serve.engine.tools.sink import CallSink, NotACall

ARGUMENT_KEYS = ("arguments", "parameters")
ARGS_TAG = "[ARGS]"
_WS = " \t\r\n"


class _At(enum.Enum):
    TOP = enum.auto()  # between calls
    LIST = enum.auto()  # a call object (or "]") comes next inside "[…]"
    LIST_AFTER = enum.auto()  # after a call inside "[…]"
    KEY = enum.auto()  # a key (or "}" when the object is empty so far) comes next
    COLON = enum.auto()
    VALUE = enum.auto()  # a field's value starts here
    FIELD = enum.auto()  # inside a field's value
    OBJECT_AFTER = enum.auto()  # after a field: "," or "}"
    HEADER = enum.auto()  # mistral's `name[ARGS]`


class _Field(enum.Enum):
    KEY = enum.auto()
    NAME = enum.auto()
    ARGS = enum.auto()  # an object, passed on as it streams
    ARGS_STRING = enum.auto()  # a string holding the arguments' JSON
    OTHER = enum.auto()  # read and dropped ("id", …)


@dataclass(slots=True)
class _Call:
    name: str | None = None
    index: int = -1
    has_args: bool = False
    early_args: list[str] = field(default_factory=list)  # arguments seen before the name


@dataclass(slots=True)
class JsonCalls:
    """A BodyParser for JSON-written calls. `names`, when given, are the only names a call
    may have (for families whose calls have no start marker, so any JSON could look like one)."""

    headers: bool = False
    names: frozenset[str] | None = None
    started: bool = False
    at: _At = _At.TOP
    _in_list: bool = False
    _finished: int = 0  # calls complete in this body
    _call: _Call = field(default_factory=_Call)
    _scan: JsonScanner = field(default_factory=JsonScanner)
    _field: _Field = _Field.KEY
    _key: str = ""
    _text: list[str] = field(default_factory=list)  # the value being read, when it is kept
    _header: str = ""

    def feed(self, text: str, sink: CallSink) -> int | None:
        i = 0
        try:
            while i < len(text):
                if self.at is _At.FIELD:
                    i += self._read_field(text[i:], sink)
                elif (used := self._char(text[i], sink)) < 0:
                    return i
                else:
                    i += used
        except ValueError as exc:
            raise NotACall(str(exc)) from exc
        return None

    def close(self, sink: CallSink) -> None:
        """The markup ended: a call cut short keeps what it had (its name came first)."""
        if not self.started:
            raise NotACall("no tool call in the markup")
        if self._call.index >= 0 and not self._call.has_args:
            sink.args(self._call.index, "{}")

    # -- between fields -------------------------------------------------------------------------

    def _char(self, ch: str, sink: CallSink) -> int:
        """Take one character: 1 used, 0 left to the field it starts, -1 the markup ended."""
        at = self.at
        if at is _At.HEADER:
            self._header_char(ch, sink)
        elif ch in _WS:
            pass
        elif at is _At.TOP:
            return self._top(ch)
        elif at is _At.LIST and ch == "{":
            self._open_object()
        elif at is _At.LIST_AFTER and ch in ",]":
            self.at, self._in_list = (_At.LIST, True) if ch == "," else (_At.TOP, False)
        elif at is _At.KEY and ch == '"':
            self._begin_field(_Field.KEY)
            return 0
        elif at is _At.KEY and ch == "}" and not self._key:
            self._end_call(sink)
        elif at is _At.COLON and ch == ":":
            self.at = _At.VALUE
        elif at is _At.VALUE:
            self._begin_field(self._value_kind(ch))
            return 0
        elif at is _At.OBJECT_AFTER and ch == ",":
            self.at = _At.KEY
        elif at is _At.OBJECT_AFTER and ch == "}":
            self._end_call(sink)
        else:
            raise ValueError(f"unexpected {ch!r} in a tool call")
        return 1

    def _top(self, ch: str) -> int:
        if ch == "{":
            self._open_object()
        elif ch == "[" and not self._finished:
            self.at, self._in_list = _At.LIST, True
        elif ch in ";," and self._finished:
            pass
        elif self.headers and not self._finished and (ch.isalnum() or ch in "_-"):
            self.at, self._header = _At.HEADER, ch
        elif self.started:
            return -1  # the calls are over; what follows is not theirs
        else:
            raise ValueError(f"unexpected {ch!r} where a tool call starts")
        return 1

    def _open_object(self) -> None:
        self.at, self._call, self._key = _At.KEY, _Call(), ""

    def _value_kind(self, ch: str) -> _Field:
        if self._key == "name":
            if ch != '"':
                raise ValueError("a tool call's name must be a string")
            return _Field.NAME
        if self._key in ARGUMENT_KEYS:
            if ch not in '{"':
                raise ValueError("a tool call's arguments must be an object")
            return _Field.ARGS if ch == "{" else _Field.ARGS_STRING
        return _Field.OTHER

    def _begin_field(self, kind: _Field) -> None:
        self.at, self._field, self._scan, self._text = _At.FIELD, kind, JsonScanner(), []

    # -- inside a field -------------------------------------------------------------------------

    def _read_field(self, text: str, sink: CallSink) -> int:
        used, accepted = self._scan.feed(text)
        if self._field is _Field.ARGS:
            self._args(accepted, sink)
        elif self._field is not _Field.OTHER:
            self._text.append(accepted)
        if self._scan.error is not None:
            raise ValueError(self._scan.error)
        if self._scan.done:
            self._end_field(sink)
        return used

    def _end_field(self, sink: CallSink) -> None:
        kind, text = self._field, "".join(self._text)
        self.at = _At.OBJECT_AFTER
        if kind is _Field.KEY:
            self._key, self.at = json.loads(text), _At.COLON
        elif kind is _Field.NAME:
            self._start(json.loads(text), sink)
        elif kind is _Field.ARGS_STRING:
            self._args(json.loads(text), sink)
        if self._header and kind is not _Field.NAME:
            self._end_call(sink)  # mistral's header call ends with its arguments

    def _args(self, text: str, sink: CallSink) -> None:
        call = self._call
        call.has_args = True
        if call.index >= 0:
            sink.args(call.index, text)
        else:
            call.early_args.append(text)

    def _start(self, name: Any, sink: CallSink) -> None:
        if not isinstance(name, str) or not name or (self.names is not None and name not in self.names):
            raise ValueError(f"{name!r} is not a tool's name")
        call = self._call
        call.name, call.index, self.started = name, sink.start(name), True
        sink.args(call.index, "".join(call.early_args))

    def _end_call(self, sink: CallSink) -> None:
        call = self._call
        if call.index < 0:
            raise ValueError("a tool call without a name")
        if not call.has_args:
            sink.args(call.index, "{}")
        self._call, self._header, self._finished = _Call(), "", self._finished + 1
        self.at = _At.LIST_AFTER if self._in_list else _At.TOP

    # -- mistral: name[ARGS]{…} -----------------------------------------------------------------

    def _header_char(self, ch: str, sink: CallSink) -> None:
        name, bracket, tag = self._header.partition("[")
        if (
            not bracket
            and (ch.isalnum() or ch in "_-")
            and not name[-1].isspace()
            or not bracket
            and ch in _WS
        ):
            self._header += ch
        elif ARGS_TAG.startswith(bracket + tag + ch):
            self._header += ch
            if self._header.endswith(ARGS_TAG):
                self._start(name.strip(), sink)
                self._key, self.at = "arguments", _At.VALUE
        else:
            raise ValueError(f"unexpected {ch!r} in a tool call's header")


def tool_names(tools: Iterable[dict[str, Any]] | None) -> frozenset[str]:
    """The function names among OpenAI-shaped tool definitions."""
    return frozenset(t["function"]["name"] for t in tools or () if isinstance(t.get("function"), dict))
