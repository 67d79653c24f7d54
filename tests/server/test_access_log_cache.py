"""The access log line names why the prefix cache missed, and the protocol's own reason."""

from __future__ import annotations

import asyncio

from mlx_serve.engine.host.client import RequestStream
from mlx_serve.engine.types import Admitted, CacheMiss, Finished, FinishReason, Request, TextDelta, Usage
from mlx_serve.server.observe import RequestRecord, log_line, trace_line


def test_the_access_log_names_the_cache_miss_and_the_protocols_reason() -> None:
    record = RequestRecord("POST", "/v1/messages", status=200, route="/v1/messages")
    record.fields += (("cache_miss_reason", "system_changed"),)
    record.event(
        0, Finished(FinishReason.STOP, Usage(300, 2, cached_tokens=256, cache_miss=CacheMiss.EVICTED))
    )
    line = log_line(record, record.summary())
    assert "cached_tokens=256" in line and "cache_miss=evicted cache_miss_reason=system_changed" in line


def test_no_cache_fields_when_nothing_missed() -> None:
    record = RequestRecord("POST", "/v1/chat/completions", status=200)
    record.event(0, Finished(FinishReason.STOP, Usage(10, 2)))
    assert "cache_miss" not in log_line(record, record.summary())


def test_a_request_whose_client_left_still_logs_what_the_prefix_cache_served() -> None:
    """No Finished ever comes for it: its line and trace take the engine's note at admission,
    which the stream keeps and never hands to the writer."""
    stream = RequestStream([Request("r1", (1,) * 300)])
    record = RequestRecord("POST", "/v1/chat/completions", status=200)
    tracked = record.track(stream)
    stream.push("r1", Admitted(256, CacheMiss.EVICTED))
    stream.push("r1", TextDelta("a"))
    assert asyncio.run(tracked.next()) == (0, TextDelta("a"))  # the note is not an event
    tracked.cancel()
    done = record.summary()
    line = log_line(record, done)
    assert "finish=abort" in line and "cached_tokens=256 " in line and "cache_miss=evicted" in line
    assert trace_line(record, done)["cached_tokens"] == 256
