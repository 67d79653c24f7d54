from __future__ import annotations

from bench.load import LevelResult, RequestRecord
from bench.report import gap_stats, median_summary, percentile, ratio_lines, summarize
from bench.serve import direct_rates


def record(
    index: int, ttft: float, tokens: int, error: str | None = None, status: int | None = 200
) -> RequestRecord:
    r = RequestRecord(index=index, variant=index, start_s=0.0, first_token_s=ttft, last_token_s=ttft + 1.0)
    r.completion_tokens, r.error, r.status = tokens, error, status
    return r


def test_percentile_interpolates() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 95) == 5.0
    assert percentile([], 50) is None


def test_summarize_counts_only_ok_requests_and_tells_dropped_from_refused() -> None:
    records = [
        record(0, 0.1, 11),
        record(1, 0.3, 21),
        record(2, 0.2, 9, "HTTP 503: busy", status=503),
        record(3, 0.2, 9, "RemoteProtocolError: peer closed connection", status=None),
        record(4, 0.2, 9, "stream ended without [DONE]"),
    ]
    s = summarize("mlx_lm", LevelResult(2, wall_s=2.0, records=records))
    assert (s.ok, s.errors, s.dropped, s.completion_tokens, s.aggregate_tps) == (2, 3, 2, 32, 16.0)
    assert s.ttft_p50_ms is not None and abs(s.ttft_p50_ms - 200.0) < 1e-9
    assert s.decode_p50_tps == 15.0  # (21 - 1) and (11 - 1) tokens over 1 s each


def test_median_summary_takes_medians_of_rates_and_sums_counts() -> None:
    rounds = [
        summarize("mlx-serve", LevelResult(1, wall, [record(0, ttft, 21), record(1, ttft, 21, "x", None)]))
        for wall, ttft in ((1.0, 0.1), (2.0, 0.3), (4.0, 0.2))
    ]
    s = median_summary(rounds)
    assert s.aggregate_tps == 10.5 and s.wall_s == 2.0  # 21 tokens over 1, 2, 4 s
    assert s.ttft_p50_ms is not None and abs(s.ttft_p50_ms - 200.0) < 1e-9
    assert (s.ok, s.errors, s.dropped, s.completion_tokens) == (3, 3, 3, 63)


def test_ratio_lines_compare_servers_and_direct() -> None:
    ours = summarize("mlx-serve", LevelResult(1, 1.0, [record(0, 0.1, 21)]))
    theirs = summarize("mlx_lm", LevelResult(1, 2.0, [record(0, 0.2, 21)]))
    lines = ratio_lines(
        {1: {"mlx-serve": ours, "mlx_lm": theirs}, 4: {"mlx-serve": ours}}, {1: 40.0, 4: 42.0}
    )
    assert "aggregate 2.00x" in lines[1] and "TTFT p95 0.50x" in lines[1] and "dropped 0 vs 0" in lines[1]
    assert "stream_generate: decode 0.500x" in lines[2]  # 20 tok/s decode (21 tokens over 1 s) / 40
    assert "batch_generate: aggregate 0.500x" in lines[3]  # 21 tok/s / 42


def test_direct_rates_are_stream_decode_at_one_and_batch_end_to_end_at_b() -> None:
    direct = {
        "runs": [{"generation_tps": 40.0}, {"generation_tps": 50.0}, {"generation_tps": 45.0}],
        "batch": {
            "16": [{"generation_tokens": 2048, "wall_s": 4.0}, {"generation_tokens": 2048, "wall_s": 2.0}]
        },
    }
    assert direct_rates(direct) == {1: 45.0, 16: 768.0}
    assert direct_rates({"error": "failed"}) == {}


def test_gap_stats_names_p50_p99_and_max() -> None:
    text = gap_stats([10.0] * 99 + [500.0])
    assert text.startswith("p50 10.0 ms") and "max 500.0 ms" in text and "n=100" in text
    assert gap_stats([]) == "no gaps"


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
