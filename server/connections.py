"""Connections: a cap on how many are open at once, and what a connection past it gets.

Hypercorn has no limit on concurrent connections, and each costs a file descriptor; past the
process's fd limit accept() fails and every route, /health included, goes down. So mlx-serve
gives Hypercorn listening sockets of its own (`CappedSocket`) that count what they accept.
Up to --max-connections a connection is Hypercorn's as usual. Past it, a small responder (at
most OVERFLOW_SLOTS at once, each with OVERFLOW_HEAD_S to send its request head) reads the one
request with h11 and runs it through the app marked over capacity: probe routes (/health,
/metrics) answer as ever, anything else gets 503 with Retry-After in its route's envelope, and
the connection is closed. With every slot taken, the one that has waited longest without a
request head is closed for the newcomer (a flood of silent connections cannot starve a probe);
on TLS a connection past the cap is closed at once. A connection counts from accept() until it
is closed: `server.transport` closes one as soon as its client does, and one that sends no
request head within its first-request timeout. Each cause is
logged once a minute with how often it happened, never as a traceback per connection.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote

import h11

from mlx_serve.engine.errors import ServeError
from mlx_serve.protocols.contract import ASGIApp, Message
from mlx_serve.server import transport

log = logging.getLogger("mlx_serve.connections")
OVER_CAPACITY = "mlx_serve.over_capacity"  # scope key: this request came in past the cap
OVERFLOW_SLOTS = 32
OVERFLOW_HEAD_S = 2.0
RESERVED_FDS = 64 + OVERFLOW_SLOTS  # model files, the engine's pipe, logs, the trace, probes
LOG_INTERVAL_S = 60.0


class ConnectionLimit(ServeError):
    """A request on a connection past --max-connections (a probe route still answers)."""

    status = 503
    retry_after_s = 1


class OncePerInterval:
    """Logs each cause at most once per interval, saying how often it recurred meanwhile."""

    def __init__(self, logger: logging.Logger, interval_s: float = LOG_INTERVAL_S) -> None:
        self._log = logger
        self._interval_s = interval_s
        self._last: dict[str, tuple[float, int]] = {}  # cause → (when last logged, since then)

    def __call__(self, cause: str, message: str, *args: object, exc: BaseException | None = None) -> None:
        now = time.monotonic()
        when, missed = self._last.get(cause, (-self._interval_s, 0))
        if now - when < self._interval_s:
            self._last[cause] = (when, missed + 1)
            return
        self._last[cause] = (now, 0)
        suffix = f" ({missed} more since the last such line)" if missed else ""
        exc_info = (type(exc), exc, exc.__traceback__) if exc is not None and not missed else None
        self._log.warning(message + suffix, *args, exc_info=exc_info)


class ConnectionGate:
    """How many connections are open, and the responder for those past the cap."""

    def __init__(self, cap: int, app: ASGIApp, tls: bool = False) -> None:
        self.cap = cap
        self.app = app
        self.tls = tls
        self.open = 0
        self.overflowing = 0
        self.refused = 0
        self.evicted = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._headless: dict[
            asyncio.Task[None], None
        ] = {}  # overflow slots still without a head, oldest first
        self._say = OncePerInterval(log)

    def take(self) -> bool:
        if self.open >= self.cap:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1

    def overflow(self, conn: socket.socket, peer: Any) -> None:
        """A connection past the cap: answer its one request (probes only), or close it."""
        self.refused += 1
        self._say("cap", "at the connection limit (%d open, --max-connections): refusing new ones", self.cap)
        if self.overflowing >= OVERFLOW_SLOTS and self._headless:
            # Slots held by connections that never sent a head go to the newest arrival, so a
            # flood of silent connections cannot keep a health probe from being answered.
            oldest = next(iter(self._headless))
            del self._headless[oldest]
            oldest.cancel()
            self.evicted += 1
        elif self.tls or self.overflowing >= OVERFLOW_SLOTS:
            conn.close()
            return
        self.overflowing += 1
        task = asyncio.get_running_loop().create_task(self._answer(conn, peer))
        self._tasks.add(task)
        self._headless[task] = None
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._headless.pop(task, None)

    async def _answer(self, conn: socket.socket, peer: Any) -> None:
        task = asyncio.current_task()
        try:
            conn.setblocking(False)
            await answer_one(conn, peer, self.app, lambda: self._headless.pop(task, None))  # type: ignore[arg-type]
        except (OSError, TimeoutError, h11.ProtocolError, asyncio.CancelledError):
            pass  # it went away, sent nothing in time, was evicted, or did not speak HTTP/1.1
        finally:
            conn.close()
            self.overflowing -= 1


class CountedSocket(socket.socket):
    """An accepted connection that gives its place back when it is closed."""

    gate: ConnectionGate | None = None

    def close(self) -> None:
        gate, self.gate = self.gate, None
        if gate is not None:
            gate.release()
        super().close()


class CappedSocket(socket.socket):
    """A listening socket whose accept() holds connections to the gate's cap."""

    gate: ConnectionGate

    @classmethod
    def adopt(cls, sock: socket.socket, gate: ConnectionGate) -> CappedSocket:
        capped = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        capped.gate = gate
        return capped

    def accept(self) -> tuple[socket.socket, Any]:
        fd, peer = self._accept()  # type: ignore[attr-defined]
        if not self.gate.take():
            self.gate.overflow(socket.socket(self.family, self.type, self.proto, fileno=fd), peer)
            raise BlockingIOError  # asyncio's accept loop: nothing more to accept just now
        conn = CountedSocket(self.family, self.type, self.proto, fileno=fd)
        conn.gate = self.gate
        return conn, peer


async def answer_one(
    conn: socket.socket, peer: Any, app: ASGIApp, headed: Callable[[], object] = lambda: None
) -> None:
    """Read one HTTP/1.1 request head, run it through `app` marked over capacity, answer, close."""
    loop = asyncio.get_running_loop()
    h = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
    async with asyncio.timeout(OVERFLOW_HEAD_S):
        while (event := h.next_event()) is h11.NEED_DATA:
            h.receive_data(await loop.sock_recv(conn, 16 * 1024))
    headed()
    if not isinstance(event, h11.Request):
        return
    status, headers, body = await _run(app, _scope(event, peer))
    headers = [(k, v) for k, v in headers if k.lower() != b"connection"] + [(b"connection", b"close")]
    out = h.send(h11.Response(status_code=status, headers=headers)) or b""
    if body and event.method != b"HEAD":
        out += h.send(h11.Data(data=body)) or b""
    out += h.send(h11.EndOfMessage()) or b""
    await loop.sock_sendall(conn, out)


def _scope(request: h11.Request, peer: Any) -> dict[str, Any]:
    path, _, query = request.target.partition(b"?")
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method.decode("ascii", "replace"),
        "scheme": "http",
        "path": unquote(path.decode("latin-1")),
        "raw_path": path,
        "query_string": query,
        "root_path": "",
        "headers": [(k.lower(), v) for k, v in request.headers],
        "client": peer if isinstance(peer, tuple) else None,
        "server": None,
        OVER_CAPACITY: True,
    }


async def _run(app: ASGIApp, scope: dict[str, Any]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """The app's whole answer to a request with no body: status, headers, body."""
    answer: dict[str, Any] = {"status": 500, "headers": [], "body": b""}
    asked = False

    async def receive() -> Message:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # nothing more comes; the answer is already written
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer["status"], answer["headers"] = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    await app(scope, receive, send)
    return answer["status"], answer["headers"], answer["body"]


def connection_cap(wanted: int) -> int:
    """--max-connections, lowered to what the fd limit allows (raised towards it if it can be)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + RESERVED_FDS
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted
    cap = max(1, soft - RESERVED_FDS)
    log.warning("--max-connections %d lowered to %d: the open-file limit is %d", wanted, cap, soft)
    return cap


def loop_exceptions(say: OncePerInterval) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """An event-loop exception handler that logs each cause once per interval."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        message = str(context.get("message", "event loop error"))
        say(f"{message}|{type(exc).__name__}", "%s: %s", message, exc or "", exc=exc)

    return handle


async def serve(
    app: ASGIApp,
    hc: Any,
    gate: ConnectionGate,
    shutdown_trigger: Callable[[], Awaitable[Any]],
    listening: Callable[[], None] = lambda: None,
) -> None:
    """Hypercorn's `serve`, on listening sockets that hold connections to the gate's cap;
    `listening` is called once they are bound (a port clash raises before it)."""
    from hypercorn.asyncio.run import worker_serve
    from hypercorn.config import Sockets
    from hypercorn.utils import wrap_app

    transport.install()
    made = hc.create_sockets()
    listening()
    sockets = Sockets(
        [CappedSocket.adopt(s, gate) for s in made.secure_sockets],
        [CappedSocket.adopt(s, gate) for s in made.insecure_sockets],
        made.quic_sockets,
    )
    asyncio.get_running_loop().set_exception_handler(loop_exceptions(OncePerInterval(log)))
    wrapped = wrap_app(app, hc.wsgi_max_body_size, "asgi")  # type: ignore[arg-type]
    await worker_serve(wrapped, hc, sockets=sockets, shutdown_trigger=shutdown_trigger)
