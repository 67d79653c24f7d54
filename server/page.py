"""The page at `/`: a status view and a chat playground, as static files of this package.

The files in `server/static/` are read once, when the app is built, and served from memory: a
name outside that listing is a 404 whatever it spells (no path is ever joined from a request),
so `..`, encoded slashes and absolute paths reach nothing. The page and its files load without
an API key; every call the page makes for data goes through the API's own routes and auth.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from mlx_serve.protocols.contract import ErrorFormat, NotFound, Receive, Route, Scope, Send
from mlx_serve.server.writer import send_json

STATIC_DIR = Path(__file__).resolve().parent / "static"
INDEX = "index.html"
CONTENT_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".svg": b"image/svg+xml",
    ".png": b"image/png",
}
# Same-origin only: no CDN, no inline script, and the page may not be framed by another site.
CSP = (
    b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    b"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    content_type: bytes
    etag: bytes


def read_static(folder: Path = STATIC_DIR) -> dict[str, StaticFile]:
    """Every servable file of `folder` by name (flat: subfolders and unknown types are left out)."""
    files = {}
    for path in sorted(folder.iterdir()):
        content_type = CONTENT_TYPES.get(path.suffix)
        if path.is_file() and content_type is not None:
            body = path.read_bytes()
            etag = b'"' + hashlib.sha256(body).hexdigest()[:20].encode() + b'"'
            files[path.name] = StaticFile(body, content_type, etag)
    return files


class Page:
    """GET / and GET /ui/{name}: the page's files, revalidated by ETag on every load (so an
    upgraded server never runs yesterday's script) and answered 304 when unchanged."""

    def __init__(self, files: dict[str, StaticFile] | None = None) -> None:
        self.files = read_static() if files is None else files

    def routes(self, errors: ErrorFormat) -> list[Route]:
        return [
            Route("GET", "/", self.index, errors, open=True),
            Route("GET", "/ui/{name}", self.asset, errors, open=True),
        ]

    async def index(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._send(scope, send, INDEX)

    async def asset(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._send(scope, send, scope["path_params"]["name"])

    async def _send(self, scope: Scope, send: Send, name: str) -> None:
        found = self.files.get(name)
        if found is None:
            raise NotFound(f"no page file named {name!r}")
        headers = [
            (b"etag", found.etag),
            (b"cache-control", b"no-cache"),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"no-referrer"),
        ]
        if found.content_type.startswith(b"text/html"):
            headers += [(b"content-security-policy", CSP), (b"x-frame-options", b"DENY")]
        if found.etag in _if_none_match(scope):
            await send({"type": "http.response.start", "status": 304, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        await send_json(send, 200, found.body, headers, content_type=found.content_type)


def _if_none_match(scope: Scope) -> list[bytes]:
    tags: list[bytes] = []
    for name, value in scope.get("headers", []):
        if name == b"if-none-match":
            tags += [t.strip().removeprefix(b"W/") for t in value.split(b",")]
    return tags
