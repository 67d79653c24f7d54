"""What every tool-call body parser shares: where its calls go, and how it says "not a call"."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Protocol

from engine.types import Delta, ToolCallArgsDelta, ToolCallStart


class NotACall(ValueError):
    """The markup read so far cannot be a tool call (of this family)."""


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class CallSink:
    """Receives a turn's calls: indexes in order across the whole turn, fresh ids, and the
    argument pieces of one feed merged into one delta per call."""

    out: list[Delta] = field(default_factory=list)
    calls: int = 0
    made: list[list[str]] = field(default_factory=list)  # [name, arguments] of each call so far

    def start(self, name: str, call_id: str | None = None) -> int:
        self.out.append(ToolCallStart(self.calls, call_id or new_call_id(), name))
        self.made.append([name, ""])
        self.calls += 1
        return self.calls - 1

    def repeated(self) -> bool:
        """Whether the last call is the same call (name and arguments) as an earlier one."""
        return len(self.made) > 1 and self.made[-1] in self.made[:-1]

    def args(self, index: int, text: str) -> None:
        if not text:
            return
        self.made[index][1] += text
        last = self.out[-1] if self.out else None
        if isinstance(last, ToolCallArgsDelta) and last.index == index:
            self.out[-1] = ToolCallArgsDelta(index, last.arguments + text)
        else:
            self.out.append(ToolCallArgsDelta(index, text))


class BodyParser(Protocol):
    """Reads the markup between a family's start and end markers, piece by piece.

    `feed` returns None while the markup goes on, or the offset in `text` where this family's
    markup ended (what follows is not part of the call). Either method raises NotACall; once
    `started` is true (a ToolCallStart went out) the calls already sent stand.
    """

    started: bool

    def feed(self, text: str, sink: CallSink) -> int | None: ...

    def close(self, sink: CallSink) -> None: ...
