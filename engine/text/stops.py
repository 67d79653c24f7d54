"""Stop strings matched on text across token boundaries, never leaked to the client."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StopMatcher:
    """Feed text pieces; get back what is safe to emit.

    Text that could still grow into a stop string is held back until it either completes
    the stop (then it and everything after are dropped) or stops matching.
    """

    stops: tuple[str, ...]
    _held: str = ""
    matched: str | None = field(default=None)

    def feed(self, text: str) -> str:
        if self.matched is not None:
            return ""
        if not self.stops:
            return text
        buf = self._held + text
        cut, which = _first_stop(buf, self.stops)
        if which is not None:
            self.matched, self._held = which, ""
            return buf[:cut]
        keep = partial_suffix_len(buf, self.stops)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """End of generation: whatever was held back was not a stop after all."""
        held, self._held = self._held, ""
        return held if self.matched is None else ""


def _first_stop(buf: str, stops: tuple[str, ...]) -> tuple[int, str | None]:
    best, which = len(buf) + 1, None
    for s in stops:
        i = buf.find(s)
        if i != -1 and i < best:
            best, which = i, s
    return best, which


def partial_suffix_len(buf: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of buf that is a proper prefix of one of `stops`."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(buf)), longest, -1):
            if buf.endswith(s[:n]):
                longest = n
                break
    return longest
