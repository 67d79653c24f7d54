"""An HTTP request's way to its handler: the route table's match, the framing and connection
checks, and a refusal as the route's own error envelope with the headers it calls for."""

from __future__ import annotations

from mlx_serve.engine.errors import EngineUnavailable, QueueFull, ServeError
from mlx_serve.protocols import openai_chat
from mlx_serve.protocols.contract import ErrorFormat, MethodNotAllowed, NotFound, Receive, Scope, Send
from mlx_serve.server.body import AmbiguousFraming, check_framing
from mlx_serve.server.connections import OVER_CAPACITY, ConnectionLimit
from mlx_serve.server.observe import record_of
from mlx_serve.server.request_parts import without_body
from mlx_serve.server.routes import Fit, RouteTable
from mlx_serve.server.writer import send_json

OPENAI_ERRORS: ErrorFormat = openai_chat.FORMAT
RETRY_AFTER_LOADING_S = 5


async def dispatch(table: RouteTable, scope: Scope, receive: Receive, send: Send) -> None:
    """Match the route and run its handler; a refusal in the route's own error envelope."""
    match = table.match_scope(scope)
    errors = match.errors or OPENAI_ERRORS
    if scope["method"] == "HEAD":
        send = without_body(send)
    try:
        check_framing(scope)
        if scope.get(OVER_CAPACITY) and not (match.route is not None and match.route.probe):
            raise ConnectionLimit("the server is at its connection limit; retry shortly")
        if match.fit is Fit.FULL:
            assert match.route is not None
            scope["path_params"] = match.params
            await match.route.handler(scope, receive, send)
        elif match.fit is Fit.PARTIAL:
            allow = ", ".join(match.allowed)
            raise MethodNotAllowed(f"{scope['method']} is not allowed on {scope['path']} (allowed: {allow})")
        else:
            raise NotFound(f"no route for {scope['method']} {scope['path']}")
    except ServeError as exc:
        record_of(scope).refused(exc)
        extra = [(b"allow", ", ".join(match.allowed).encode())] if match.fit is Fit.PARTIAL else []
        await send_error(send, errors, exc, extra)


async def send_error(
    send: Send, fmt: ErrorFormat, exc: ServeError, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = list(extra or [])
    if isinstance(exc, QueueFull | ConnectionLimit):
        headers.append((b"retry-after", str(exc.retry_after_s).encode()))
    elif isinstance(exc, EngineUnavailable):
        headers.append((b"retry-after", str(RETRY_AFTER_LOADING_S).encode()))
    elif isinstance(exc, AmbiguousFraming):
        headers.append((b"connection", b"close"))  # where this body ends is unknowable
    await send_json(send, exc.status, fmt.error_body(exc), headers)
