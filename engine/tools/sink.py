"""What every tool-call body parser shares: where its calls go, and how it says "not a call"."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Protocol

from mlx_serve.engine.types import Delta, ToolCallArgsDelta, ToolCallStart


class NotACall(ValueError):
    """The markup read so far cannot be a tool call (of this family)."""


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class CallSink:
    """Receives a turn's calls: indexes in order across the whole turn, fresh ids, and the
    argument pieces of one feed merged into one delta per call.

    A call that may yet be a verbatim repeat of an earlier one (same name, its arguments so far
    a prefix of that call's) is held back: small models repeat their call after a tool result,
    and a client that saw the repeat would run the tool twice. It goes out once it differs
    (`args`) or the answer ends (`release`); a whole repeat is dropped (`drop_repeat`)."""

    out: list[Delta] = field(default_factory=list)
    calls: int = 0
    made: list[list[str]] = field(default_factory=list)  # [name, arguments] of each call so far
    held: list[Delta] = field(default_factory=list)  # the open call's deltas while it may be a repeat

    def start(self, name: str, call_id: str | None = None) -> int:
        self.release()
        self.made.append([name, ""])
        self.calls += 1
        self._emit(ToolCallStart(self.calls - 1, call_id or new_call_id(), name), self._may_repeat())
        return self.calls - 1

    def repeated(self) -> bool:
        """Whether the last call is the same call (name and arguments) as an earlier one."""
        return len(self.made) > 1 and self.made[-1] in self.made[:-1]

    def drop_repeat(self) -> None:
        """Forget the last call, a repeat still held back: the client never sees it."""
        if self.held:
            self.held, self.calls = [], self.calls - 1
            self.made.pop()

    def release(self) -> None:
        """Send the held call: it is not a repeat after all, or nothing more will be read."""
        held, self.held = self.held, []
        for delta in held:
            self._emit(delta, False)

    def args(self, index: int, text: str) -> None:
        if not text:
            return
        self.made[index][1] += text
        hold = bool(self.held) and self._may_repeat()
        if self.held and not hold:
            self.release()
        self._emit(ToolCallArgsDelta(index, text), hold)

    def _may_repeat(self) -> bool:
        name, sent = self.made[-1]
        return any(n == name and a.startswith(sent) for n, a in self.made[:-1])

    def _emit(self, delta: Delta, hold: bool) -> None:
        out = self.held if hold else self.out
        last = out[-1] if out else None
        if (
            isinstance(delta, ToolCallArgsDelta)
            and isinstance(last, ToolCallArgsDelta)
            and last.index == delta.index
        ):
            out[-1] = ToolCallArgsDelta(delta.index, last.arguments + delta.arguments)
        else:
            out.append(delta)


class BodyParser(Protocol):
    """Reads the markup between a family's start and end markers, piece by piece.

    `feed` returns None while the markup goes on, or the offset in `text` where this family's
    markup ended (what follows is not part of the call). Either method raises NotACall; once
    `started` is true (a ToolCallStart went out) the calls already sent stand.
    """

    started: bool

    def feed(self, text: str, sink: CallSink) -> int | None: ...

    def close(self, sink: CallSink) -> None: ...
