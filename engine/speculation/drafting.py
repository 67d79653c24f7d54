"""Where draft tokens come from, and when a row should stop asking for them.

A drafter proposes the tokens that follow a row's history. Prompt lookup (n-grams) finds the
row's latest n-gram earlier in its own prompt and output and proposes what followed it; a
prediction (OpenAI Predicted Outputs) is the same lookup over the text the client expects.
Drafts cost nothing to make here; a draft model's drafts are made inside the batch step
(engine/speculation/verify.py), not by these classes.

NOTE, the lazy guess. After a plain (pipelined) decode step the row's next input token is still
being computed when drafts are wanted. Rather than wait for it, a drafter may look up the
history *without* it and return `guess`: its prediction of that token. The verify step then
accepts nothing when the guess turns out wrong — it costs a wider forward, never correctness.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MAX_NGRAM = 3


@dataclass(slots=True)
class Draft:
    guess: int | None  # the drafter's prediction of the pending input token (None: drafts follow it)
    tokens: list[int]


@dataclass(slots=True)
class NgramIndex:
    """n-gram → where it last ended, over one growing token sequence (n = 1..MAX_NGRAM)."""

    min_n: int = 1
    _ends: dict[tuple[int, ...], int] = field(default_factory=dict)
    _upto: int = 0  # n-grams ending at or before this position are indexed

    def index(self, seq: list[int], end: int) -> None:
        """Index every n-gram of seq that ends at or before `end`."""
        for stop in range(self._upto + 1, end + 1):
            for n in range(1, min(MAX_NGRAM, stop) + 1):
                self._ends[tuple(seq[stop - n : stop])] = stop
        self._upto = max(self._upto, end)

    def find(self, tail: list[int]) -> int | None:
        """Where the longest indexed n-gram that ends `tail` last ended."""
        for n in range(min(MAX_NGRAM, len(tail)), self.min_n - 1, -1):
            at = self._ends.get(tuple(tail[len(tail) - n :]))
            if at is not None:
                return at
        return None

    def lookup(self, seq: list[int], k: int, pending: int | None = None) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the tail of seq (with
        `pending` after it, when given) — without copying seq, which grows every step."""
        if pending is None:
            self.index(seq, len(seq) - 1)  # the tail itself ends at len(seq): never found
            at = self.find(seq)
            return seq[at : at + k] if at is not None else []
        self.index(seq, len(seq))
        at = self.find(_tail(seq, pending))
        if at is None:
            return []
        found = seq[at : at + k]
        return found + [pending] if len(found) < k else found


class PromptLookup:
    """Drafts from the row's own prompt and output (`--draft-kind ngram`)."""

    def __init__(self) -> None:
        self._index = NgramIndex(min_n=2)

    def draft(self, history: list[int], pending: int | None, k: int) -> Draft:
        if pending is not None:
            return Draft(None, self._index.lookup(history, k, pending))
        return _guessed(self._index.lookup(history, k + 1))


PREDICTION_K = 16  # a prediction's longest draft: the prediction, not the server's γ, says what follows
PREDICTION_MIN_K = 4  # its shortest, after a run of rejections
NEAR = 8  # a lone token re-finds the place after an edit only this close to where it was expected


class PredictionLookup:
    """Drafts from the client's predicted output: where the output's tail sits in the prediction,
    propose what comes next there. Before any output, the prediction's opening is the draft.

    After an edit (the output leaves the prediction) the place is found again: when the tokens
    before the last one still follow, the last token is a prediction token a few places on
    (some were deleted) or one changed in place (the alignment holds); otherwise the tail's
    longest n-gram where it occurs nearest to the expected place (an insertion or a deletion
    shifts it), a lone token only close by. Small edits to long code, Predicted Outputs' use."""

    def __init__(self, prediction: tuple[int, ...], prompt_len: int) -> None:
        self._pred = list(prediction)
        self._prompt_len = prompt_len
        self._ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> every position it ends at
        for stop in range(1, len(self._pred) + 1):
            for n in range(1, min(MAX_NGRAM, stop) + 1):
                self._ends.setdefault(tuple(self._pred[stop - n : stop]), []).append(stop)
        self._cursor: tuple[int, int] | None = None  # (position in prediction, output length then)

    def draft(self, history: list[int], pending: int | None, k: int) -> Draft:
        # Only the output's length and its last few tokens matter: no copy of the history.
        out_len = len(history) - self._prompt_len + (pending is not None)
        tail = _tail(history[max(self._prompt_len, len(history) - MAX_NGRAM - 1) :], pending, MAX_NGRAM + 1)
        want = k if pending is not None else k + 1
        at = self._locate(tail, out_len)
        found = self._pred[at : at + want] if at is not None else []
        if at is not None:
            self._cursor = (at, out_len)
        return Draft(None, found) if pending is not None else _guessed(found)

    def _locate(self, tail: list[int], out_len: int) -> int | None:
        if not out_len:
            return 0
        expected = out_len if self._cursor is None else self._cursor[0] + out_len - self._cursor[1]
        for at in (expected, out_len):  # where the last match continues to; the output's own length
            if self._follows(tail, at):
                return at
        if len(tail) > 1 and self._follows(tail[:-1], expected - 1):  # the last token left the prediction
            for skipped in range(1, NEAR + 1):  # a few of its tokens deleted: it goes on after them
                if (
                    expected - 1 + skipped < len(self._pred)
                    and self._pred[expected - 1 + skipped] == tail[-1]
                ):
                    return expected + skipped
            return expected if expected <= len(self._pred) else None  # changed in place
        for n in range(min(MAX_NGRAM, len(tail)), 0, -1):
            ends = self._ends.get(tuple(tail[len(tail) - n :]))
            if ends:
                at = _nearest(ends, expected)
                if n > 1 or abs(at - expected) <= NEAR:
                    return at
        if self._cursor is not None and out_len - self._cursor[1] <= NEAR:
            return self._cursor[0]  # an edit still being written: the prediction resumes where it left off
        return None

    def _follows(self, tail: list[int], at: int) -> bool:
        """Whether the output's tail is what the prediction has just before position `at`."""
        n = min(MAX_NGRAM, len(tail), at)
        return 0 < n and at <= len(self._pred) and self._pred[at - n : at] == tail[len(tail) - n :]


def _nearest(ends: list[int], expected: int) -> int:
    i = bisect.bisect_left(ends, expected)
    after, before = (ends[i] if i < len(ends) else None), (ends[i - 1] if i else None)
    if before is None or (after is not None and after - expected <= expected - before):
        assert after is not None
        return after
    return before


def _tail(seq: list[int], pending: int | None, n: int = MAX_NGRAM) -> list[int]:
    """The last n tokens of seq followed by pending (when there is one)."""
    last = seq[len(seq) - n :] if len(seq) > n else list(seq)
    return (last + [pending])[-n:] if pending is not None else last


def _guessed(found: list[int]) -> Draft:
    # Looked up without the pending token: the first token found is the guess for it.
    return Draft(found[0], found[1:]) if len(found) > 1 else Draft(None, [])


@dataclass(slots=True)
class RowSpeculation:
    """One row's speculation: its drafter, its γ, its acceptance, and whether it is paused.

    Adaptive: after a few drafting steps, a row whose accepted share of drafted tokens is
    below `min_acceptance` pauses for a while (doubling each time), so a row that never
    matches stops paying for wider forwards. A prediction never pauses (its text is the
    client's own); instead its draft length follows what it accepted: two more than the longest
    run matched before a rejection in its last few rejections (one short run — a step that
    began late in a stretch — does not shrink it), doubled after a draft accepted whole,
    between PREDICTION_MIN_K and k. An edited file's unchanged stretches are then verified
    about as wide as they are long, not k wide (a compute-bound batch pays for every position).
    """

    drafter: PromptLookup | PredictionLookup | None  # None: the draft model drafts
    k: int
    prediction: bool = False
    min_acceptance: float = 0.25
    _window_drafted: int = 0
    _window_accepted: int = 0
    _pause: int = 0
    _backoff: int = 8
    _length: int = 0  # a prediction's draft length now (0: k)
    _runs: list[int] = field(default_factory=list)  # what its last few rejected drafts had matched

    @property
    def active(self) -> bool:
        if self._pause > 0:
            self._pause -= 1
            return False
        return self.k > 0

    @property
    def draft_len(self) -> int:
        """How many tokens this row drafts next."""
        return self._length or self.k

    def record(self, drafted: int, accepted: int) -> None:
        if self.prediction and drafted:
            if accepted >= drafted:
                length = 2 * drafted
            else:
                self._runs = [*self._runs[-3:], accepted]
                length = max(self._runs) + 2
            self._length = max(min(length, self.k), min(PREDICTION_MIN_K, self.k))
        self._window_drafted += drafted
        self._window_accepted += accepted
        if self._window_drafted < 4 * max(self.k, 1):
            return
        if self._window_accepted < self.min_acceptance * self._window_drafted and not self.prediction:
            self._pause, self._backoff = self._backoff, min(self._backoff * 2, 256)
        elif self._window_accepted >= self.min_acceptance * self._window_drafted:
            self._backoff = 8
        self._window_drafted = self._window_accepted = 0
