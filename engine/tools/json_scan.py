"""One JSON value checked as its text streams in, a character at a time.

Whatever the scanner accepts is a valid prefix of a JSON value, so a caller may pass it on
at once; the value is whole when `done`. Strict JSON forbids raw control characters inside
strings and models sometimes write them (a newline in a code argument): they come out
escaped, so the text passed on always parses.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any

_WS = " \t\r\n"
_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]*')
_NUMBER_CHARS = frozenset("0123456789+-.eE")
_NUMBER_PREFIX = re.compile(r"-|-?(?:0|[1-9][0-9]*)(?:\.[0-9]*)?(?:(?<=[0-9])[eE][+-]?[0-9]*)?")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}
_ESCAPES = frozenset('"\\/bfnrt')
_HEX = frozenset("0123456789abcdefABCDEF")


class _At(enum.Enum):
    VALUE = enum.auto()  # a value starts here
    VALUE_OR_CLOSE = enum.auto()  # just after "["
    KEY_OR_CLOSE = enum.auto()  # just after "{"
    KEY = enum.auto()  # after "," in an object
    COLON = enum.auto()
    AFTER = enum.auto()  # after a value inside a container
    STRING = enum.auto()
    ESCAPE = enum.auto()
    UNICODE = enum.auto()
    NUMBER = enum.auto()
    LITERAL = enum.auto()
    DONE = enum.auto()


@dataclass(slots=True)
class JsonScanner:
    """Feed text; get back how much of it continues the value and the text to pass on.
    At the first character no JSON value could have there, it stops and says why in `error`."""

    at: _At = _At.VALUE
    stack: list[str] = field(default_factory=list)  # open containers: "{" or "["
    _key: bool = False  # the open string is an object key
    _pending: str = ""  # the number so far, or the rest of a literal
    _hex_left: int = 0
    error: str | None = None

    @property
    def done(self) -> bool:
        return self.at is _At.DONE

    def feed(self, text: str) -> tuple[int, str]:
        out: list[str] = []
        i = 0
        while i < len(text) and self.at is not _At.DONE and self.error is None:
            if self.at is _At.STRING:
                j = _STRING_RUN.match(text, i).end()  # type: ignore[union-attr]
                out.append(text[i:j])
                if (i := j) == len(text):
                    break
            try:
                used, emitted = self._step(text[i])
            except ValueError as exc:
                self.error = str(exc)
                break
            out.append(emitted)
            i += used
        return i, "".join(out)

    def closers(self) -> str:
        """What closes the open containers."""
        return "".join("}" if c == "{" else "]" for c in reversed(self.stack))

    def _step(self, ch: str) -> tuple[int, str]:
        at = self.at
        if at is _At.STRING:
            return 1, self._string_char(ch)
        if at is _At.ESCAPE:
            return self._escape(ch)
        if at is _At.UNICODE:
            if ch not in _HEX:
                raise ValueError(f"bad \\u escape at {ch!r}")
            self._hex_left -= 1
            self.at = _At.UNICODE if self._hex_left else _At.STRING
            return 1, ch
        if at is _At.NUMBER:
            return self._number(ch)
        if at is _At.LITERAL:
            return self._literal(ch)
        if ch in _WS:
            return 1, ch
        return 1, self._structure(ch)

    def _string_char(self, ch: str) -> str:
        if ch == '"':
            self._key, was_key = False, self._key
            if was_key:
                self.at = _At.COLON
            else:
                self._value_ended()
            return ch
        if ch == "\\":
            self.at = _At.ESCAPE
            return ch
        return json.dumps(ch)[1:-1]  # a raw control character

    def _escape(self, ch: str) -> tuple[int, str]:
        if ch == "u":
            self.at, self._hex_left = _At.UNICODE, 4
        elif ch in _ESCAPES:
            self.at = _At.STRING
        else:
            raise ValueError(f"bad escape \\{ch}")
        return 1, ch

    def _number(self, ch: str) -> tuple[int, str]:
        if ch in _NUMBER_CHARS and _NUMBER_PREFIX.fullmatch(self._pending + ch):
            self._pending += ch
            return 1, ch
        if not _NUMBER.fullmatch(self._pending):
            raise ValueError(f"bad number {self._pending + ch!r}")
        self._value_ended()
        return 0, ""  # ch belongs to what follows the number

    def _literal(self, ch: str) -> tuple[int, str]:
        if ch != self._pending[:1]:
            raise ValueError(f"bad literal at {ch!r}")
        self._pending = self._pending[1:]
        if not self._pending:
            self._value_ended()
        return 1, ch

    def _structure(self, ch: str) -> str:
        at = self.at
        if at is _At.VALUE or (at is _At.VALUE_OR_CLOSE and ch != "]"):
            self._begin_value(ch)
        elif at is _At.COLON and ch == ":":
            self.at = _At.VALUE
        elif at in (_At.KEY_OR_CLOSE, _At.KEY) and ch == '"':
            self.at, self._key = _At.STRING, True
        elif ch == "," and at is _At.AFTER:
            self.at = _At.KEY if self.stack[-1] == "{" else _At.VALUE
        elif (ch == "}" and at in (_At.KEY_OR_CLOSE, _At.AFTER) and self.stack[-1] == "{") or (
            ch == "]" and at in (_At.VALUE_OR_CLOSE, _At.AFTER) and self.stack[-1] == "["
        ):
            self.stack.pop()
            self._value_ended()
        else:
            raise ValueError(f"unexpected {ch!r} in JSON")
        return ch

    def _begin_value(self, ch: str) -> None:
        if ch in "{[":
            self.stack.append(ch)
            self.at = _At.KEY_OR_CLOSE if ch == "{" else _At.VALUE_OR_CLOSE
        elif ch == '"':
            self.at = _At.STRING
        elif ch in "-0123456789":
            self.at, self._pending = _At.NUMBER, ch
        elif ch in _LITERALS:
            self.at, self._pending = _At.LITERAL, _LITERALS[ch]
        else:
            raise ValueError(f"unexpected {ch!r} where a JSON value starts")

    def _value_ended(self) -> None:
        self.at = _At.AFTER if self.stack else _At.DONE


def partial_value(text: str) -> Any:
    """What a JSON text cut short holds so far, read as the SDKs' partial parsers read a
    stream: the members it finished, its open containers closed, an unfinished last member
    dropped. None when not even a container was opened."""
    scanner, out = JsonScanner(), ""
    whole: str | None = None
    for ch in text:
        _, accepted = scanner.feed(ch)
        out += accepted
        if scanner.error is not None or scanner.done:
            break
        if scanner.at in (_At.AFTER, _At.KEY_OR_CLOSE, _At.VALUE_OR_CLOSE):
            whole = out + scanner.closers()
    if scanner.done:
        return json.loads(out)
    if scanner.error is None and scanner.at is _At.NUMBER and _NUMBER.fullmatch(scanner._pending):
        whole = out + scanner.closers()  # a number the text ends on counts, if it is whole
    return None if whole is None else json.loads(whole)
