"""Tier 2: the one writer, alone: SSE framing, heartbeats, error frames, disconnects, JSON
sends and collected results, with a hand-fed stream and hand-written receive/send."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from mlx_serve.engine.errors import EngineFailed, ServeError
from mlx_serve.engine.types import (
    Admitted,
    Delta,
    Event,
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from mlx_serve.protocols.contract import (
    KEEP_ALIVE,
    Frame,
    Frames,
    Message,
    Result,
    SseComment,
    SseEvent,
    ToolCall,
)
from mlx_serve.server.writer import SSE_HEADERS, collect, encode, encode_frame, send_json, stream_sse

T = TypeVar("T")
WARNING = (b"warning", b'299 - "max_tokens clamped to 12"')
END = {"type": "http.response.body", "body": b"", "more_body": False}
Item = tuple[int, Event] | ServeError | None


class FakeStream:
    """An EventStream fed by the test: put (index, event) items, a ServeError to raise, or None
    to end; admit() the engine's note of the row's start. Cancelling ends it too, as the engine
    ends a cancelled call. As the engine's, its admission waits for the note or for anything else."""

    def __init__(self, n: int = 1) -> None:
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self.n = n
        self.cancels = 0
        self.note: Admitted | None = None
        self.admitted = asyncio.Event()

    def admit(self, note: Admitted) -> None:
        self.note = note
        self.admitted.set()

    async def admission(self) -> Admitted | None:
        await self.admitted.wait()
        return self.note

    @property
    def tickets(self) -> list[int]:
        return list(range(self.n))

    def put(self, *items: Item) -> None:
        for item in items:
            self.queue.put_nowait(item)
        self.admitted.set()

    def pending(self) -> int:
        return self.queue.qsize()

    async def next(self) -> tuple[int, Event] | None:
        item = await self.queue.get()
        if isinstance(item, ServeError):
            raise item
        return item

    def cancel(self) -> None:
        self.cancels += 1
        self.queue.put_nowait(None)
        self.admitted.set()


@dataclass
class Client:
    """receive() blocks until the client leaves; send() records every message."""

    messages: list[Message] = field(default_factory=list)
    gone: asyncio.Event = field(default_factory=asyncio.Event)

    async def receive(self) -> Message:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])

    @property
    def chunks(self) -> list[bytes]:
        """The body chunks before the end of the body."""
        assert self.messages[-1] == END
        return [m["body"] for m in self.messages[1:-1]]


class Renderer:
    """A toy StreamRenderer: named start (with the cached tokens it was told of), unnamed text
    chunks, a `[DONE]` after the finish, a `ping` comment for a heartbeat."""

    def start(self, admitted: Admitted | None = None) -> Frames:
        cached = {"cached": admitted.cached_tokens} if admitted is not None else {}
        return [SseEvent({"type": "start", **cached}, "start")]

    def delta(self, event: Delta, index: int = 0) -> Frames:
        text = getattr(event, "text", "")
        return [SseEvent({"text": text, "index": index})] if text else []

    def finish(self, event: Finished, index: int = 0) -> Frames:
        return [SseEvent({"finish": event.reason.value}), SseEvent("[DONE]")]

    def error(self, exc: ServeError) -> Frames:
        return [SseEvent({"error": exc.message}, "error"), SseEvent("[DONE]")]

    def heartbeat(self) -> Frame:
        return SseComment("ping")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 5.0))


def streamed(stream: FakeStream, client: Client, heartbeat_s: float = 15.0) -> Coroutine[Any, Any, None]:
    return stream_sse(client.receive, client.send, stream, Renderer(), heartbeat_s, [WARNING])


STOP = Finished(FinishReason.STOP, Usage(3, 2))


# --- framing --------------------------------------------------------------------------------


def test_encode_unnamed_event_is_one_data_line() -> None:
    assert encode_frame(SseEvent({"a": 1, "b": "é"})) == 'data: {"a":1,"b":"é"}\n\n'.encode()


def test_encode_named_event_has_an_event_line_first() -> None:
    frame = SseEvent({"type": "message_stop"}, "message_stop")
    assert encode_frame(frame) == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def test_encode_done_is_the_literal_text() -> None:
    assert encode_frame(SseEvent("[DONE]")) == b"data: [DONE]\n\n"


def test_encode_comment_and_text_over_lines() -> None:
    assert encode_frame(KEEP_ALIVE) == b": keep-alive\n\n"
    assert encode_frame(SseComment("a\nb")) == b": a\n: b\n\n"
    assert encode_frame(SseEvent("one\ntwo", "note")) == b"event: note\ndata: one\ndata: two\n\n"


def test_encode_a_batch_is_its_frames_in_order() -> None:
    frames: Frames = [SseEvent({"x": 1}), KEEP_ALIVE, SseEvent("[DONE]")]
    assert encode(frames) == b"".join(encode_frame(f) for f in frames)
    assert encode([]) == b""


# --- streams ----------------------------------------------------------------------------------


def test_stream_sse_headers_then_one_chunk_per_engine_event() -> None:
    stream, client = FakeStream(), Client()

    async def go() -> None:
        task = asyncio.create_task(streamed(stream, client))
        for item in ((0, TextDelta("Hel")), (0, TextDelta("")), (0, TextDelta("lo")), (0, STOP), None):
            await asyncio.sleep(0.01)  # each event arrives while the writer waits: it goes out alone
            stream.put(item)
        await task

    run(go())
    assert client.messages[0] == {
        "type": "http.response.start",
        "status": 200,
        "headers": [*SSE_HEADERS, WARNING],
    }
    assert client.headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert client.chunks == [  # the empty delta sends nothing
        b'event: start\ndata: {"type":"start"}\n\n',
        b'data: {"text":"Hel","index":0}\n\n',
        b'data: {"text":"lo","index":0}\n\n',
        b'data: {"finish":"stop"}\n\ndata: [DONE]\n\n',
    ]
    assert all(m["more_body"] for m in client.messages[1:-1])
    assert stream.cancels == 1  # a finished call is let go all the same


def test_stream_sse_events_already_queued_go_out_as_one_chunk_in_order() -> None:
    # A loop that fell behind finds several tokens of a stream waiting: one send for all of them.
    stream, client = FakeStream(), Client()
    stream.put((0, TextDelta("Hel")), (0, TextDelta("lo")), (0, TextDelta(" you")), (0, STOP), None)
    run(streamed(stream, client))
    assert client.chunks == [
        b'event: start\ndata: {"type":"start"}\n\n',
        (
            b'data: {"text":"Hel","index":0}\n\ndata: {"text":"lo","index":0}\n\n'
            b'data: {"text":" you","index":0}\n\ndata: {"finish":"stop"}\n\ndata: [DONE]\n\n'
        ),
    ]


def test_stream_sse_sends_heartbeats_while_the_engine_is_quiet() -> None:
    stream, client = FakeStream(), Client()
    stream.admit(Admitted(0))

    async def go() -> None:
        task = asyncio.create_task(streamed(stream, client, heartbeat_s=0.02))
        await asyncio.sleep(0.15)
        stream.put((0, TextDelta("a")), (0, STOP), None)
        await task

    run(go())
    chunks = client.chunks
    assert chunks[0] == b'event: start\ndata: {"type":"start","cached":0}\n\n'
    beats = chunks[1:-1]
    assert len(beats) >= 3 and set(beats) == {b": ping\n\n"}  # the renderer's own heartbeat
    assert chunks[-1] == (  # what came together goes out together
        b'data: {"text":"a","index":0}\n\ndata: {"finish":"stop"}\n\ndata: [DONE]\n\n'
    )


def test_stream_sse_a_queued_request_gets_comments_then_its_start_with_the_cached_tokens() -> None:
    # Waiting for a row: the head at once, SSE comments (not the format's heartbeat event, which
    # may not come before its first event), then the first events with what the cache served.
    stream, client = FakeStream(), Client()

    async def go() -> None:
        task = asyncio.create_task(streamed(stream, client, heartbeat_s=0.02))
        await asyncio.sleep(0.15)
        assert client.messages[0]["type"] == "http.response.start"
        stream.admit(Admitted(96))
        await asyncio.sleep(0.01)
        stream.put((0, TextDelta("a")), (0, STOP), None)
        await task

    run(go())
    chunks = client.chunks
    start = chunks.index(b'event: start\ndata: {"type":"start","cached":96}\n\n')
    assert start >= 3 and set(chunks[:start]) == {b": keep-alive\n\n"}
    assert chunks[-1].startswith(b'data: {"text":"a","index":0}\n\n')


def test_stream_sse_an_error_before_admission_follows_the_start() -> None:
    stream, client = FakeStream(), Client()

    async def go() -> None:
        task = asyncio.create_task(streamed(stream, client, heartbeat_s=0.02))
        await asyncio.sleep(0.05)
        stream.put(EngineFailed("no row for it"))
        await task

    run(go())
    chunks = client.chunks
    assert chunks[-2:] == [  # the start without cache figures, then the renderer's error frame
        b'event: start\ndata: {"type":"start"}\n\n',
        b'event: error\ndata: {"error":"no row for it"}\n\ndata: [DONE]\n\n',
    ]
    assert set(chunks[:-2]) <= {b": keep-alive\n\n"}
    assert stream.cancels == 1


def test_stream_sse_a_disconnect_while_queued_cancels_the_request() -> None:
    stream, client = FakeStream(), Client()

    async def go() -> None:
        task = asyncio.create_task(streamed(stream, client, heartbeat_s=0.02))
        await asyncio.sleep(0.05)
        client.gone.set()  # never admitted: only the disconnect watch can end it
        await task

    run(go())
    assert stream.cancels == 2  # the disconnect watch, then the writer's own cleanup
    assert client.messages[-1] == END


def test_stream_sse_error_after_headers_is_the_renderers_error_frame() -> None:
    stream, client = FakeStream(), Client()
    stream.put((0, TextDelta("a")), EngineFailed("engine crashed"), (0, TextDelta("never")))
    run(streamed(stream, client))
    assert client.messages[0]["status"] == 200
    assert client.chunks[-1] == (  # the text before the error, then the renderer's error frame
        b'data: {"text":"a","index":0}\n\nevent: error\ndata: {"error":"engine crashed"}\n\ndata: [DONE]\n\n'
    )
    assert b"never" not in b"".join(client.chunks)
    assert stream.cancels == 1


def test_stream_sse_client_disconnect_cancels_the_stream_at_once() -> None:
    stream, client = FakeStream(), Client()

    async def go() -> None:
        task = asyncio.create_task(streamed(stream, client))
        stream.put((0, TextDelta("a")))
        await asyncio.sleep(0.02)
        client.gone.set()  # the engine never ends this call: only the disconnect watch can
        await task

    run(go())
    assert stream.cancels == 2  # the disconnect watch, then the writer's own cleanup
    assert client.chunks == [b'event: start\ndata: {"type":"start"}\n\n', b'data: {"text":"a","index":0}\n\n']


# --- JSON -------------------------------------------------------------------------------------


def test_send_json_sets_type_length_and_extra_headers() -> None:
    client = Client()
    run(send_json(client.send, 201, b'{"ok":true}', [WARNING]))
    assert client.messages == [
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"11"), WARNING],
        },
        {"type": "http.response.body", "body": b'{"ok":true}'},
    ]


def test_collect_assembles_one_result_per_choice() -> None:
    stream, client = FakeStream(n=2), Client()
    top = TokenLogprob("He", -0.1, (("He", -0.1),))
    stream.put(
        (1, ReasoningDelta("hmm ")),
        (0, TextDelta("He", (1,), (top,))),
        (1, ReasoningDelta("ok")),
        (1, ToolCallStart(0, "call_1", "f")),
        (0, TextDelta("llo")),
        (1, ToolCallArgsDelta(0, '{"a": ')),
        (1, ToolCallArgsDelta(0, "1}")),
        (0, Finished(FinishReason.LENGTH, Usage(4, 2))),
        (1, Finished(FinishReason.TOOL_CALLS, Usage(4, 5), "END")),
        None,
    )
    results = run(collect(client.receive, stream))
    assert results == [
        Result("Hello", FinishReason.LENGTH, Usage(4, 2), logprobs=(top,)),
        Result(
            "",
            FinishReason.TOOL_CALLS,
            Usage(4, 5),
            "END",
            reasoning="hmm ok",
            tool_calls=(ToolCall("call_1", "f", '{"a": 1}'),),
        ),
    ]
    assert stream.cancels == 1 and client.messages == []


def test_collect_is_none_when_the_client_leaves_first() -> None:
    stream, client = FakeStream(n=2), Client()

    async def go() -> list[Result] | None:
        task = asyncio.create_task(collect(client.receive, stream))
        stream.put((0, TextDelta("a")), (0, STOP))
        await asyncio.sleep(0.02)
        client.gone.set()
        return await task

    assert run(go()) is None
    assert stream.cancels == 2  # the disconnect watch, then collect's own cleanup


def test_collect_lets_an_engine_error_reach_the_caller() -> None:
    stream, client = FakeStream(), Client()
    stream.put((0, TextDelta("a")), EngineFailed("engine crashed"))
    with pytest.raises(EngineFailed):
        run(collect(client.receive, stream))
    assert stream.cancels == 1
