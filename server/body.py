"""Reading a request body: what is refused before it is read, and while it is read.

- `Content-Length` past --max-body-bytes: 413 at once, before a byte of the body is read.
- A `Content-Type` that is clearly not JSON: 415 naming the header. Accepted: none at all,
  `application/json` and any `+json` type, `text/json`, `text/plain` (what browsers' no-CORS
  fetches and beacons send) and `application/x-www-form-urlencoded` (curl -d's default), each
  with no charset or UTF-8; the body is then parsed as JSON whatever the type said.
- The whole body must arrive within --body-timeout-s: 408 otherwise, so a chunked body that
  never ends, or one that trickles a byte at a time, does not hold its connection forever.
- A body cut short (the client half-closed, or left, before its end) is a 400 saying how much
  came; the answer is written in case the client still reads.
- `Transfer-Encoding` and `Content-Length` together are a 400 and the connection is closed
  (RFC 9112 6.3: the framing is ambiguous, the classic request-smuggling shape).
"""

from __future__ import annotations

import asyncio
from typing import cast

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.protocols.contract import PayloadTooLarge, Receive, Scope

JSON_TYPES = frozenset({"application/json", "text/json", "text/plain", "application/x-www-form-urlencoded"})


class UnsupportedMediaType(InvalidRequest):
    status = 415


class RequestTimeout(InvalidRequest):
    status = 408


class IncompleteBody(InvalidRequest):
    """The body ended (the client half-closed or left) before all of it came."""


class AmbiguousFraming(InvalidRequest):
    """Both Transfer-Encoding and Content-Length: answered, then the connection is closed."""


def check_framing(scope: Scope) -> None:
    if header(scope, b"transfer-encoding") is not None and header(scope, b"content-length") is not None:
        raise AmbiguousFraming(
            "a request may not carry both `Transfer-Encoding` and `Content-Length` (RFC 9112)",
            param="Content-Length",
        )


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value)
    return None


def check_head(scope: Scope, limit: int) -> int:
    """What the request's headers alone decide: its type and its declared length (0: none)."""
    check_content_type(header(scope, b"content-type"))
    raw = header(scope, b"content-length")
    length = int(raw) if raw is not None and raw.strip().isdigit() else 0
    if length > limit:
        raise PayloadTooLarge(f"request body is over the {limit}-byte limit (Content-Length: {length})")
    return length


def check_content_type(value: bytes | None) -> None:
    if value is None:
        return
    media, _, params = value.decode("latin-1").partition(";")
    media = media.strip().lower()
    if (media in JSON_TYPES or media.endswith("+json")) and _charset(params) in ("utf-8", "utf8"):
        return
    raise UnsupportedMediaType(
        f"`Content-Type: {value.decode('latin-1')}` is not JSON: send the body as application/json (UTF-8)",
        param="Content-Type",
    )


def _charset(params: str) -> str:
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset":
            return value.strip(" \"'").lower()
    return "utf-8"


async def read_body(scope: Scope, receive: Receive, limit: int, timeout_s: float) -> bytes:
    """The whole request body: 413 once it passes `limit` bytes (or says it will), 408 when it
    has not all arrived within `timeout_s`, 415 for a type that is not JSON."""
    try:
        length = check_head(scope, limit)
    except PayloadTooLarge:
        if _declared(scope) <= DRAIN_FACTOR * limit:  # far larger: refused at once, unread
            await _drain(receive, DRAIN_FACTOR * limit, min(timeout_s, DRAIN_TIMEOUT_S))
        raise
    try:
        async with asyncio.timeout(timeout_s):
            return await _read(receive, limit, length)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g} s") from None
    except _TooLarge as exc:  # more of the body is coming: read (and drop) it first, briefly
        await _drain(receive, DRAIN_FACTOR * limit, min(timeout_s, DRAIN_TIMEOUT_S))
        raise PayloadTooLarge(exc.message) from None


class _TooLarge(PayloadTooLarge):
    """Over the limit with more of the body still to come."""


def _declared(scope: Scope) -> int:
    raw = header(scope, b"content-length")
    return int(raw) if raw is not None and raw.strip().isdigit() else 0


# A client or proxy (nginx) that sends its whole body before reading the answer gets the 413 only
# if the rest is read: a close with unread data resets the connection (nginx then answers 502).
# Up to this many times the limit is read and dropped, briefly; a larger declared body is not.
DRAIN_FACTOR = 2
DRAIN_TIMEOUT_S = 10.0


async def _drain(receive: Receive, max_bytes: int, timeout_s: float) -> None:
    dropped = 0
    try:
        async with asyncio.timeout(timeout_s):
            while dropped <= max_bytes:
                message = await receive()
                if message["type"] != "http.request":
                    return
                dropped += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return
    except TimeoutError:
        return


async def _read(receive: Receive, limit: int, size_hint: int) -> bytes:
    # Grown in place (to Content-Length at once when it is given): joining 30 MB of chunks at
    # the end would hold the GIL, and so the event loop, for tens of milliseconds.
    body = bytearray(size_hint)
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            declared = f" of the {size_hint} its Content-Length declared" if size_hint else ""
            raise IncompleteBody(f"the request body ended after {size} bytes{declared}, before its end")
        chunk = message.get("body", b"")
        if size + len(chunk) > limit:
            more = _TooLarge if message.get("more_body", False) else PayloadTooLarge
            raise more(f"request body is over the {limit}-byte limit")
        body[size : size + len(chunk)] = chunk
        size += len(chunk)
        if not message.get("more_body", False):
            del body[size:]
            # A bytearray reads as bytes everywhere a body goes (msgspec, orjson, slicing).
            return cast("bytes", body)
