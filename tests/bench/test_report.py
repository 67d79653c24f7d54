from __future__ import annotations

from bench.load import LevelResult, RequestRecord
from bench.report import percentile, ratio_lines, summarize


def record(index: int, ttft: float, tokens: int, error: str | None = None) -> RequestRecord:
    r = RequestRecord(index=index, variant=index, start_s=0.0, first_token_s=ttft, last_token_s=ttft + 1.0)
    r.completion_tokens, r.error = tokens, error
    return r


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 95) == 5.0
    assert percentile([], 50) is None


def test_summarize_counts_only_ok_requests() -> None:
    level = LevelResult(
        2, wall_s=2.0, records=[record(0, 0.1, 11), record(1, 0.3, 21), record(2, 0.2, 9, "boom")]
    )
    s = summarize("mlx_lm", level)
    assert (s.ok, s.errors, s.completion_tokens, s.aggregate_tps) == (2, 1, 32, 16.0)
    assert s.ttft_p50_ms is not None and abs(s.ttft_p50_ms - 200.0) < 1e-9
    assert s.error_samples == ["boom"]


def test_ratio_lines_compare_servers_and_direct() -> None:
    ours = summarize("mlx-serve", LevelResult(1, 1.0, [record(0, 0.1, 21)]))
    theirs = summarize("mlx_lm", LevelResult(1, 2.0, [record(0, 0.2, 21)]))
    lines = ratio_lines({1: {"mlx-serve": ours, "mlx_lm": theirs}}, direct_tps=40.0)
    assert "aggregate tok/s 2.00x" in lines[1] and "TTFT p95 0.50x" in lines[1]
    assert "mlx-serve decode p50 / direct mlx-lm decode: 0.500" in lines[2]


def test_trace_summary_splits_ttft_into_queue_prefill_and_the_hops_between_processes() -> None:
    from bench.trace_summary import phases, summarize

    line = {
        "phases_s": {
            "body_read": 0.001,
            "submitted": 0.01,
            "first_token": 0.56,
            "first_write": 0.011,
            "end": 2.0,
        },
        "engine_s": [
            {
                "engine_in": 0.03,
                "admission_wait": 0.4,
                "prefill_chunks": [[75, 0.45]],
                "first_token": 0.5,
                "finished": 1.9,
            }
        ],
    }
    got = phases(line)
    assert abs(got["engine_admission_wait"] - 0.43) < 1e-9  # the engine clock starts when it took it in
    assert abs(got["prefill_after_admission"] - 0.1) < 1e-9
    assert abs(got["engine_to_server"] - 0.03) < 1e-9  # first token: engine 0.53, server 0.56
    held = phases({**line, "engine_s": [{**line["engine_s"][0], "first_delta": 0.52}]})
    assert abs(held["engine_to_server"] - 0.01) < 1e-9  # its text went out at 0.55: the hop is 0.01
    old = phases(
        {
            "phases_s": {"submitted": 0.01, "first_token": 0.6},
            "engine_s": [{"admission_wait": 0.4, "first_token": 0.5}],
        }
    )  # no engine_in: from submit
    assert abs(old["engine_first_token"] - 0.51) < 1e-9
    text = summarize([line, {"phases_s": {"submitted": 0.02, "first_write": None}, "engine_s": [None]}])
    assert text.startswith("2 requests") and "engine_admission_wait" in text
