from __future__ import annotations

import asyncio
import json

import httpx

from bench.load import LoadSpec, RequestRecord, one_request
from bench.prompts import Prompt

PROMPT = Prompt(variant=7, messages=[{"role": "user", "content": "hi"}], num_tokens=None)


def spec() -> LoadSpec:
    return LoadSpec(1, 1, 8, 0, "default_model", lambda index: PROMPT)


def sse(*frames: str) -> bytes:
    return "".join(f"data: {f}\n\n" for f in frames).encode()


def run(handler: httpx.MockTransport) -> RequestRecord:
    async def go() -> RequestRecord:
        async with httpx.AsyncClient(transport=handler) as client:
            return await one_request(client, "http://test/v1/chat/completions", spec(), 3)

    return asyncio.run(go())


def chunk(content: str) -> str:
    return json.dumps({"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]})


def test_one_request_reads_usage_and_done() -> None:
    usage = '{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}'
    body = sse(chunk("a"), chunk("b"), chunk("c"), usage, "[DONE]")
    record = run(httpx.MockTransport(lambda request: httpx.Response(200, content=body)))
    assert record.ok and record.got_done
    assert (record.completion_tokens, record.prompt_tokens, record.content_chunks) == (3, 5, 3)
    assert record.ttft_s is not None and record.variant == 7


def test_one_request_counts_chunks_without_usage() -> None:
    body = sse(chunk("a"), chunk("b"), "[DONE]")
    record = run(httpx.MockTransport(lambda request: httpx.Response(200, content=body)))
    assert record.ok and record.num_tokens == 2


def test_one_request_missing_done_is_an_error() -> None:
    body = sse(chunk("a"))
    record = run(httpx.MockTransport(lambda request: httpx.Response(200, content=body)))
    assert record.error == "stream ended without [DONE]"


def test_one_request_http_error_is_recorded() -> None:
    record = run(httpx.MockTransport(lambda request: httpx.Response(429, json={"error": "busy"})))
    assert record.status == 429 and record.error is not None and record.error.startswith("HTTP 429")


def test_one_request_connection_failure_is_recorded() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    record = run(httpx.MockTransport(refuse))
    assert record.error == "ConnectError: refused"


def test_one_request_in_band_error_frame_is_an_error() -> None:
    body = sse(chunk("a"), '{"error":{"message":"engine died"}}', "[DONE]")
    record = run(httpx.MockTransport(lambda request: httpx.Response(200, content=body)))
    assert record.error is not None and "engine died" in record.error


def test_one_request_sends_greedy_streaming_body() -> None:
    seen: list[bytes] = []

    def capture(request: httpx.Request) -> httpx.Response:
        seen.append(request.content)
        return httpx.Response(200, content=sse("[DONE]"))

    run(httpx.MockTransport(capture))
    assert b'"stream":true' in seen[0] and b'"include_usage":true' in seen[0]
    assert b'"temperature":0' in seen[0] and b'"max_tokens":8' in seen[0]


def test_decode_tps_uses_tokens_after_the_first() -> None:
    record = RequestRecord(index=0, variant=0, start_s=0.0, first_token_s=1.0, last_token_s=3.0)
    record.completion_tokens = 5
    assert record.decode_tps == 2.0


def test_a_level_spread_over_client_processes_sends_every_request_once() -> None:
    """The forked clients (one event loop each) share the level's requests: each index is sent
    exactly once, C at a time, and every record comes back to the parent."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from bench.load import run_level

    seen: list[str] = []
    in_flight, most = [0], [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            with lock:
                seen.append(body["messages"][0]["content"])
                in_flight[0] += 1
                most[0] = max(most[0], in_flight[0])
            payload = sse(
                chunk("a"),
                chunk("b"),
                '{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}',
                "[DONE]",
            )
            import time

            time.sleep(0.05)
            with lock:
                in_flight[0] -= 1
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        prompt = lambda i: Prompt(
            variant=i % 3, messages=[{"role": "user", "content": f"q{i}"}], num_tokens=None
        )
        level = asyncio.run(
            run_level(
                f"http://127.0.0.1:{server.server_address[1]}",
                LoadSpec(6, 20, 8, 100, "m", prompt),
                processes=3,
            )
        )
    finally:
        server.shutdown()
    assert sorted(seen) == sorted(f"q{i}" for i in range(100, 120))
    assert [r.index for r in level.records] == list(range(100, 120))
    assert all(r.ok and r.num_tokens == 2 for r in level.records)
    assert most[0] <= 6 and level.wall_s > 0
