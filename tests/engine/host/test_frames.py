"""The engine process's framed messages (engine.host.frames) over a real socket pair: whatever the
kernel delivers at a time, the reader hands over exactly the whole messages sent, in order,
never blocks, and notices the other end going away."""

from __future__ import annotations

import socket
import threading

from mlx_serve.engine.host.frames import HEADER, FrameReader, FrameWriter
from mlx_serve.engine.types import Finished, FinishReason, TextDelta, Usage


def read_until(reader: FrameReader, count: int, sock: socket.socket) -> list[object]:
    """Read as the event loop does: only when the socket is readable."""
    import select

    got: list[object] = []
    while len(got) < count and not reader.closed:
        select.select([sock], [], [], 5)
        got += reader.read()
    return got


def test_messages_arrive_whole_and_in_order_including_one_larger_than_the_socket_buffer() -> None:
    a, b = socket.socketpair()
    writer, reader = FrameWriter(a.fileno()), FrameReader(b.fileno())
    big = TextDelta("x" * (3 << 20))  # 3 MiB: many receives, and the writer blocks until they happen
    sent = [TextDelta("a"), big, TextDelta("b"), Finished(FinishReason.STOP, Usage(1, 2))]
    thread = threading.Thread(target=lambda: [writer.send(m) for m in sent])
    thread.start()
    got = read_until(reader, len(sent), b)
    thread.join()
    assert got == sent
    assert reader.read() == []  # nothing more, and no wait for it


def test_a_steps_events_cross_intact_whatever_their_kind() -> None:
    """Events pickles text events as their plain fields (engine.host.process_messages); every kind of
    event, with or without logprobs, an error among them, comes out equal on the other side."""
    from mlx_serve.engine.errors import EngineFailed
    from mlx_serve.engine.host.process_messages import Events
    from mlx_serve.engine.types import TokenLogprob, ToolCallArgsDelta, ToolCallStart

    a, b = socket.socketpair()
    writer, reader = FrameWriter(a.fileno()), FrameReader(b.fileno())
    lp = TokenLogprob("hi", -0.25, (("hi", -0.25), ("ho", -1.5)))
    items: list[tuple[str, object]] = [
        ("r1", TextDelta("hi", (17,), (lp,))),
        ("r2", TextDelta("", ())),
        ("r2", ToolCallStart(0, "call_1", "get_weather")),
        ("r2", ToolCallArgsDelta(0, '{"city": "Paris"}')),
        ("r1", Finished(FinishReason.LENGTH, Usage(3, 1))),
    ]
    writer.send(Events(items))  # type: ignore[arg-type]
    writer.send(Events([("r3", EngineFailed("generation failed: boom"))]))
    got = read_until(reader, 2, b)
    assert isinstance(got[0], Events) and got[0].items == items
    assert isinstance(got[1], Events)
    ((rid, err),) = got[1].items
    assert rid == "r3" and isinstance(err, EngineFailed) and err.message == "generation failed: boom"


def test_a_partly_arrived_message_waits_for_its_rest() -> None:
    import pickle

    a, b = socket.socketpair()
    reader = FrameReader(b.fileno())
    data = pickle.dumps(TextDelta("hello"))
    frame = HEADER.pack(len(data)) + data
    a.sendall(frame[:3])
    assert reader.read() == []  # half a header
    a.sendall(frame[3:-2])
    assert reader.read() == []  # the header and most of the body
    a.sendall(frame[-2:] + frame)  # its end, and a second one whole
    assert read_until(reader, 2, b) == [TextDelta("hello"), TextDelta("hello")]


def test_the_reader_sees_the_child_go() -> None:
    a, b = socket.socketpair()
    writer, reader = FrameWriter(a.fileno()), FrameReader(b.fileno())
    writer.send(TextDelta("last words"))
    del writer
    a.close()  # the writer holds a duplicate of the end: the child exiting closes both
    got = read_until(reader, 2, b)
    assert got == [TextDelta("last words")]
    assert reader.closed
