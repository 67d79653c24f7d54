"""Tool calls out of generated text, as they stream.

Text outside the family's markup flows on as text. A call goes out as a ToolCallStart (its
index in the turn, an id, the function's name) as soon as its name is certain, then as
ToolCallArgsDelta pieces of its arguments' JSON while they are written (for the families
that stream them; the others send their arguments whole at the end marker, see
`tool_formats`). A possible marker split across pieces is held back, never leaked.
Whitespace alone between a call and the next call or the end of the answer is layout, not
text, and is dropped (a newline between two calls must not become a text block).

Markup that does not parse:
- before its call has started (the name is not certain yet), it is text after all: the
  start marker and everything read since go out as text, nothing is lost;
- once the call has started, the call stands with the arguments already sent (a call with
  none gets `{}`) and the rest of that markup, up to its end marker, is dropped. A generation
  that stops inside a call (max_tokens) likewise keeps the arguments written so far.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from mlx_serve.engine.text.stops import partial_suffix_len
from mlx_serve.engine.tools.formats import ToolFormat
from mlx_serve.engine.tools.sink import BodyParser, CallSink, NotACall
from mlx_serve.engine.types import Delta, TextDelta

log = logging.getLogger("mlx_serve.engine")


FENCE = "```"
FENCE_INFO = ("", "json")
FENCE_LINE_MAX = 32  # a fence's first line longer than this is not a call's


def bare_call_opening(answer: str) -> int | None:
    """Where a bare JSON call's `{` is in an answer's opening (stripped of leading space): 0
    when it opens with `{`, past the fence when it opens with a ```json (or plain ```) fence
    whose next line is `{`; -1 when the answer is not opened by a call; None when a fence's
    first line is not complete yet. Small models write their call in a fence as often as bare."""
    if answer.startswith("{"):
        return 0
    if not answer.startswith(FENCE):
        return None if FENCE.startswith(answer) else -1
    newline = answer.find("\n")
    if newline < 0:
        return None if len(answer) <= FENCE_LINE_MAX else -1
    if answer[len(FENCE) : newline].strip().lower() not in FENCE_INFO:
        return -1
    body = answer[newline + 1 :]
    lead = len(body) - len(body.lstrip())
    if lead == len(body):
        return None if len(body) <= FENCE_LINE_MAX else -1
    return newline + 1 + lead if body[lead] == "{" else -1


@dataclass(slots=True)
class ToolCallSplitter:
    """Feed text pieces; get back text deltas and tool-call deltas, in order."""

    fmt: ToolFormat
    tools: Any = None
    sink: CallSink = field(default_factory=CallSink)
    _held: str = ""
    _body: BodyParser | None = None  # inside a call's markup
    _markup: list[str] = field(default_factory=list)  # that markup as written, until it starts
    _dropping: bool = False  # a started call's markup broke off: drop it up to the end marker
    _fresh: bool = True  # no answer text yet (bare JSON calls open the answer)
    _after_call: bool = False  # a call went out and no text since
    _bare: bool = False  # the open markup had no start marker (bare or fenced JSON)
    _calls_only: bool = False  # the answer opened with a bare call: it holds calls and nothing else
    ended: bool = False  # the answer is over (see `_between_calls`): the generation should stop
    _layout: str = ""  # whitespace after a call, dropped unless text follows

    @property
    def calls(self) -> int:
        return self.sink.calls

    def feed(self, text: str) -> list[Delta]:
        out: list[Delta] = []
        self.sink.out = out
        if self.ended:
            return out
        buf, self._held = self._held + text, ""
        while buf and not self.ended:
            buf = self._outside(buf) if self._body is None else self._inside(buf)
        if self.sink.repeated():  # equal to a whole call's arguments: this one is whole too
            log.warning(
                "the model repeated a tool call it had just made: the repeat is dropped, the answer ends"
            )
            self.sink.drop_repeat()
            self.ended = True
        elif self.ended:
            self.sink.release()
        return out

    def close(self) -> list[Delta]:
        """End of generation: held text is text, or the rest of an unterminated call."""
        out: list[Delta] = []
        self.sink.out = out
        held, self._held = self._held, ""
        if self.ended or (self._calls_only and self._body is None):
            self.sink.release()
            return out  # a fence's closing line, a partial end marker: layout after the calls
        if self._body is None:
            self._text(held)
        elif self._give(held) is None:
            self._finish("")
        self.sink.release()
        return out

    def _outside(self, buf: str) -> str:
        if self._calls_only:
            return self._between_calls(buf)
        if self.fmt.bare_json and self._fresh:
            lead = len(buf) - len(buf.lstrip())
            if lead == len(buf):
                self._held = buf
                return ""
            opening = bare_call_opening(buf[lead:])
            if opening is None:  # a fence's first line not all here yet
                self._held = buf
                return ""
            self._fresh = False
            if opening >= 0:
                self._open(buf[: lead + opening], bare=True)
                return buf[lead + opening :]
        at = buf.find(self.fmt.start)
        if at < 0:
            keep = partial_suffix_len(buf, (self.fmt.start,))
            self._held = buf[len(buf) - keep :]
            self._text(buf[: len(buf) - keep])
            return ""
        self._text(buf[:at])
        self._open(self.fmt.start)
        return buf[at + len(self.fmt.start) :]

    def _inside(self, buf: str) -> str:
        end = self.fmt.end
        at = buf.find(end) if end else -1
        if end and at < 0:
            keep = partial_suffix_len(buf, (end,))
            piece, self._held = buf[: len(buf) - keep], buf[len(buf) - keep :]
        else:
            piece = buf if at < 0 else buf[:at]
        rest = self._give(piece)
        if rest is not None:  # the markup ended inside the piece, or was text after all
            if at >= 0:
                return rest + buf[at:]
            tail, self._held = self._held, ""  # a held partial end marker comes after `rest`
            return rest + tail
        if at < 0:
            return ""
        self._finish(end)
        return buf[at + len(end) :]

    def _between_calls(self, buf: str) -> str:
        """After a bare call: more calls (bare, fenced or in markup), the fence that closes a
        call, a stray end marker and whitespace are read; anything else ends the answer. A
        bare call has no end marker, so what a model writes after its calls (junk, or the
        same call again and again, as small models do) would otherwise run to max_tokens."""
        rest = buf.lstrip()
        if not rest:
            return ""
        opening = bare_call_opening(rest)
        if opening is not None and opening >= 0:
            self._open(rest[:opening], bare=True)
            return rest[opening:]
        if opening is None or any(m.startswith(rest) for m in (self.fmt.start, self.fmt.end) if m):
            self._held = rest  # not decided yet
            return ""
        if rest.startswith(FENCE):  # the fence closing the call just made
            newline = rest.find("\n")
            return "" if newline < 0 else rest[newline + 1 :]
        for marker in (self.fmt.end, self.fmt.start):
            if marker and rest.startswith(marker):
                if marker == self.fmt.start:
                    self._open(marker)
                return rest[len(marker) :]
        self.ended = True
        return ""

    def _open(self, marker: str, bare: bool = False) -> None:
        self._body, self._fresh, self._bare = self.fmt.body(self.tools), False, bare
        self._markup, self._layout = [self._layout + marker], ""  # layout returns if it is text

    def _give(self, piece: str) -> str | None:
        """Feed the open markup; the text after it when it ended (or fell back), else None."""
        body = self._body
        assert body is not None
        if self._dropping or not piece:
            return None
        if not body.started:
            self._markup.append(piece)
        try:
            ended = body.feed(piece, self.sink)
        except NotACall as exc:
            return self._broken(body, exc)
        if ended is None:
            return None
        if self.fmt.end and not self._bare:  # trailing junk inside the markers
            self._dropping = True
            return None
        self._finish("")
        return piece[ended:]

    def _broken(self, body: BodyParser, exc: NotACall) -> str | None:
        if body.started and (self._bare or self._calls_only):  # JSON after bare calls, not a call
            self.ended = True
            return None
        if body.started:
            log.warning("dropping tool-call markup that broke off after the call started: %s", exc)
            self._dropping = True
            return None
        self._body = None
        if self._calls_only:  # JSON after the calls that is not a call: the answer is over
            self.ended, self._markup = True, []
            return ""
        self._text("".join(self._markup))
        self._markup = []
        return ""

    def _finish(self, end_marker: str) -> None:
        body, self._body = self._body, None
        assert body is not None
        if not self._dropping:
            try:
                body.close(self.sink)
            except NotACall:
                self._text("".join(self._markup) + end_marker)
        self._after_call = self._after_call or body.started
        self._calls_only = self._calls_only or (self._bare and body.started)
        self._markup, self._dropping = [], False

    def _text(self, text: str) -> None:
        if not text:
            return
        if self._after_call:
            if text.isspace():
                self._layout += text
                return
            text, self._layout, self._after_call = self._layout + text, "", False
        self.sink.release()
        self.sink.out.append(TextDelta(text))
        self._fresh = False
