"""Drive an ASGI app by hand: exact control of receive() and a record of every send()."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(slots=True)
class Reply:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    header_list: list[tuple[str, str]] = field(default_factory=list)  # repeated names kept

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.header_list if k == name]

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    def json(self) -> Any:
        return orjson.loads(self.body)

    def sse_data(self) -> list[str]:
        text = self.body.decode()
        return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


async def call(
    app: Any,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    disconnect_after_chunks: int | None = None,
    disconnect_after_s: float | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
    timeout_s: float = 10.0,
) -> Reply:
    """One request. With `disconnect_after_chunks`, the client leaves after that many body chunks."""
    reply = Reply()
    gone = asyncio.Event()
    sent_request = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_request
        if not sent_request:
            sent_request = True
            return {"type": "http.request", "body": body, "more_body": False}
        if disconnect_after_s is not None:
            await asyncio.sleep(disconnect_after_s)
        else:
            await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            reply.status = message["status"]
            reply.header_list = [(k.decode(), v.decode()) for k, v in message.get("headers", [])]
            reply.headers = dict(reply.header_list)
        elif message["type"] == "http.response.body" and message.get("body"):
            reply.chunks.append(message["body"])
            if disconnect_after_chunks is not None and len(reply.chunks) >= disconnect_after_chunks:
                gone.set()

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers or [],
        "query_string": b"",
        "http_version": "1.1",
    }
    await asyncio.wait_for(app(scope, receive, send), timeout_s)
    gone.set()
    return reply


async def wait_until(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def run_registry(app: Any, test: Callable[[Any], Awaitable[None]]) -> None:
    """Run `test(app)` on an event loop with the app's model registry started, and stop it."""

    async def go() -> None:
        app.registry.start()
        try:
            await test(app)
        finally:
            app.registry.stop()

    asyncio.run(go())
