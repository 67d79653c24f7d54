"""The access log line names why the prefix cache missed, and the protocol's own reason."""

from __future__ import annotations

from engine.types import CacheMiss, Finished, FinishReason, Usage
from server.observe import RequestRecord, log_line


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
