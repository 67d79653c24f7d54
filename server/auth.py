"""API keys: checked in constant time on every API route, refused in the route's own error shape.

A key arrives as `Authorization: Bearer <key>` (OpenAI SDKs) or `x-api-key: <key>` (Anthropic
SDKs). Keys come from --api-key, --api-key-file (one per line, so a key can be rotated without
a gap) and the MLX_SERVE_API_KEY environment variable; with none, every route is open.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from mlx_serve.protocols.contract import ASGIApp, Receive, Scope, Send, Unauthorized
from mlx_serve.server.config import Config
from mlx_serve.server.routes import RouteTable
from mlx_serve.server.writer import refuse_websocket, send_json

log = logging.getLogger("mlx_serve.auth")
PRINCIPAL_KEY = "mlx_serve.principal"  # set in the scope when a request carried an accepted key
ENV_KEY = "MLX_SERVE_API_KEY"


class KeyFileError(ValueError):
    """--api-key-file cannot be read or holds no key."""


def load_api_keys(config: Config, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Every accepted key, from the flag, the key file and the environment."""
    keys = [config.api_key] if config.api_key else []
    if config.api_key_file:
        keys += _read_key_file(Path(config.api_key_file))
    if environ.get(ENV_KEY):
        keys.append(environ[ENV_KEY])
    return keys


def _read_key_file(path: Path) -> list[str]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise KeyFileError(f"--api-key-file {path}: {exc.strerror or exc}") from exc
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if not keys:
        raise KeyFileError(f"--api-key-file {path}: no key in it")
    if path.stat().st_mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning("--api-key-file %s is readable by other users; chmod 600 it", path)
    return keys


def presented_keys(headers: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
    """The keys a client sent, from `Authorization: Bearer` and `x-api-key`."""
    found = []
    for name, value in headers:
        if name == b"x-api-key":
            found.append(value.strip())
        elif name == b"authorization" and value[:7].lower() == b"bearer ":
            found.append(value[7:].strip())
    return found


class ApiKeys:
    """The accepted keys; `check` compares a presented key with each in constant time."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = [k.encode() for k in keys]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def check(self, presented: Iterable[bytes]) -> bool:
        return self.matching(presented) is not None

    def matching(self, presented: Iterable[bytes]) -> bytes | None:
        """The accepted key among those presented, or None."""
        # Compare with every key, so the time taken does not say which one matched.
        matches = [(p, hmac.compare_digest(p, key)) for p in presented for key in self._keys]
        return next((p for p, ok in matches if ok), None)


UNAUTHORIZED = Unauthorized(
    "missing or invalid API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
)
CHALLENGE = (b"www-authenticate", b'Bearer realm="mlx-serve"')


class AuthMiddleware:
    """ASGI middleware: 401 in the route's own error shape unless the request carries a key.

    Routes the table marks open (/health, /metrics unless protected by a flag) and CORS
    preflights pass without one; lifespan passes untouched.
    """

    def __init__(self, app: ASGIApp, keys: ApiKeys, table: RouteTable) -> None:
        self.app = app
        self.keys = keys
        self.table = table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._socket(scope, receive, send)
            return
        if scope["type"] != "http" or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        body = self.table.errors_for(scope["path"]).error_body(UNAUTHORIZED)
        await send_json(send, UNAUTHORIZED.status, body, [CHALLENGE])

    async def _socket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A WebSocket upgrade carries the key in its handshake, or is answered 401."""
        key = self.keys.matching(presented_keys(scope.get("headers", []))) if self.keys else None
        if key is not None:
            scope[PRINCIPAL_KEY] = principal_of(key)
        if key is not None or not self.keys:
            await self.app(scope, receive, send)
            return
        await receive()  # websocket.connect
        body = self.table.errors_for(scope["path"]).error_body(UNAUTHORIZED)
        await refuse_websocket(scope, send, UNAUTHORIZED.status, body, [CHALLENGE])

    def _allowed(self, scope: Scope) -> bool:
        if not self.keys or scope["method"] == "OPTIONS":
            return True
        match = self.table.match_scope(scope)
        key = self.keys.matching(presented_keys(scope.get("headers", [])))
        if key is not None:
            scope[PRINCIPAL_KEY] = principal_of(key)
        return key is not None or (match.route is not None and match.route.open)


def principal_of(key: bytes) -> str:
    """Who a key belongs to, for what is kept per client (stored responses): a digest, never the key."""
    return hashlib.sha256(key).hexdigest()[:24]
