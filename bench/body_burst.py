"""Whose is the body read's tail? N streaming requests at once, sent three ways, against a
running mlx-serve started with `--trace FILE`; prints the trace's `body_read` (from the app's
first sight of the request to its whole body) for each burst.

    python -m bench.body_burst --port 8080 --trace FILE [--clients 64] [--rounds 4]

- httpx: `httpx.AsyncClient`, as bench.load and the openai SDK send: the head, then (after the
  client's event loop has run its other tasks) the body.
- one write: head and body in one `write` on a raw socket.
- two writes: the head, then the body at once, as two TCP segments (asyncio sets TCP_NODELAY).

If "two writes" is as quick as "one write" and httpx is not, the tail is the time the client
took between its two writes (on a shared machine, the load client's own loop), not the server's.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import httpx
import orjson

from bench.load import request_body
from bench.prompts import build_prompt
from bench.trace_summary import quantile, read_trace

KINDS = ("httpx", "one write", "two writes")


def _head(port: int, length: int) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    ).encode()


async def _raw(port: int, body: bytes, split: bool) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = _head(port, len(body))
    if split:
        writer.write(head)
        await writer.drain()
        writer.write(body)
    else:
        writer.write(head + body)
    await writer.drain()
    while await reader.read(1 << 16):
        pass
    writer.close()


async def _httpx(client: httpx.AsyncClient, port: int, body: bytes) -> None:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    headers = {"content-type": "application/json"}
    async with client.stream("POST", url, content=body, headers=headers) as response:
        async for _ in response.aiter_raw():
            pass


async def burst(kind: str, port: int, clients: int, max_tokens: int) -> None:
    bodies = [
        orjson.dumps(request_body(build_prompt(i, None, None), max_tokens, "default_model"))
        for i in range(clients)
    ]
    if kind == "httpx":
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            await asyncio.gather(*(_httpx(client, port, b) for b in bodies))
    else:
        await asyncio.gather(*(_raw(port, b, kind == "two writes") for b in bodies))


def body_reads_ms(trace: Path, last: int) -> list[float]:
    return [line["phases_s"]["body_read"] * 1000 for line in read_trace(trace)[-last:]]


async def main_async(args: argparse.Namespace) -> None:
    n = args.clients
    for kind in KINDS:  # warm-up: the server's first bursts
        await burst(kind, args.port, n, args.max_tokens)
    print(f"{n} streaming requests at once, {args.max_tokens} tokens each; body_read from {args.trace}")
    for rnd in range(args.rounds):
        for kind in KINDS:
            await burst(kind, args.port, n, args.max_tokens)
            await asyncio.sleep(0.5)  # the trace lines are written as each request ends
            ms = body_reads_ms(args.trace, n)
            p50, p95 = quantile(ms, 0.5), quantile(ms, 0.95)
            print(f"  round {rnd} {kind:10s} body_read p50 {p50:6.2f}  p95 {p95:6.2f}  max {max(ms):6.2f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--trace", type=Path, required=True, help="the server's --trace FILE")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
