"""The route table: (method, path pattern) → Route, matched once per request.

A match is FULL (method and path), PARTIAL (the path exists for other methods: 405 with
`Allow`) or NONE (404), as Starlette's routes answer. Which error envelope an unmatched path
gets is decided here too: that of the longest route path it extends (/v1/messages/x speaks
Anthropic), else the table's default.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from mlx_serve.protocols.contract import ErrorFormat, Route, Scope

MATCH_KEY = "mlx_serve.match"
OTHER = "other"  # the one metric label of every unknown path (scanners must not add series)
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class Fit(enum.Enum):
    NONE = "none"
    PARTIAL = "partial"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class Match:
    fit: Fit
    route: Route | None = None
    params: dict[str, str] = field(default_factory=dict)
    allowed: tuple[str, ...] = ()
    errors: ErrorFormat | None = None
    label: str = OTHER


def _pattern(path: str) -> re.Pattern[str]:
    parts = re.split(r"\{(\w+)\}", path)
    regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>[^/]+)" for i, p in enumerate(parts))
    return re.compile(f"^{regex}$")


class RouteTable:
    """The server's endpoints, in the order they are matched."""

    def __init__(self, routes: Iterable[Route], default_errors: ErrorFormat) -> None:
        self.routes: Sequence[Route] = tuple(routes)
        self.default_errors = default_errors
        self._compiled = [(r, _pattern(r.path)) for r in self.routes]

    def match(self, method: str, path: str) -> Match:
        path = path.rstrip("/") or "/"
        allowed: list[str] = []
        for route, pattern in self._compiled:
            found = pattern.match(path)
            if found is None:
                continue
            if route.method == method or (method == "HEAD" and route.method == "GET"):
                return Match(
                    Fit.FULL, route, found.groupdict(), errors=route.errors, label=route.metric_label
                )
            allowed.append(route.method)
        if allowed:
            label = next(r.metric_label for r, p in self._compiled if p.match(path))
            return Match(Fit.PARTIAL, allowed=tuple(allowed), errors=self.errors_for(path), label=label)
        return Match(Fit.NONE, errors=self.errors_for(path))

    def errors_for(self, path: str) -> ErrorFormat:
        """The envelope of the longest route path that `path` lies under."""
        best, best_len = self.default_errors, -1
        for route in self.routes:
            stem = route.path.split("{", 1)[0].rstrip("/")
            if (path == stem or path.startswith(stem + "/")) and len(stem) > best_len:
                best, best_len = route.errors, len(stem)
        return best

    def match_scope(self, scope: Scope) -> Match:
        """The request's match, computed once and kept in its scope for the layers after."""
        found = scope.get(MATCH_KEY)
        if not isinstance(found, Match):
            found = scope[MATCH_KEY] = self.match(scope["method"], scope["path"])
        return found


def method_label(method: str) -> str:
    """A bounded metric label for the HTTP method (any other string is one series)."""
    return method if method in KNOWN_METHODS else "OTHER"
