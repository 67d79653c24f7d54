"""Tier 2: per-request records, Prometheus metrics, the request log line, --trace and the
shutdown drain, with a fake engine and hand-driven receive/send."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlx_serve.engine.errors import ServeError
from mlx_serve.engine.host.client import EngineState
from mlx_serve.engine.host.thread import ThreadEngine
from mlx_serve.engine.types import Admitted, Delta, Finished, Request
from mlx_serve.protocols.contract import Frame, SseComment, SseEvent
from mlx_serve.server.app import App
from mlx_serve.server.config import Config
from mlx_serve.server.metrics import ChoiceDone, Metrics, RequestDone, running_and_waiting
from mlx_serve.server.observe import RequestObserver, TraceWriter, record_of
from mlx_serve.server.routes import RouteTable, method_label
from mlx_serve.server.shutdown import Drain
from mlx_serve.server.writer import stream_sse
from tests.support.asgi import call, wait_until
from tests.support.fake_engine import fake_engine


class Frames:
    """A minimal StreamRenderer: one text event per engine event."""

    def start(self, admitted: Admitted | None = None) -> list[Frame]:
        return [SseEvent("start")]

    def delta(self, event: Delta, index: int = 0) -> list[Frame]:
        return [SseEvent(f"delta {getattr(event, 'text', '')}")]

    def finish(self, event: Finished, index: int = 0) -> list[Frame]:
        return [SseEvent(f"finish {event.reason.value}")]

    def error(self, exc: ServeError) -> list[Frame]:
        return [SseEvent(f"error {exc.status} {exc.message}")]

    def heartbeat(self) -> Frame:
        return SseComment("ping")


def table_of(engine: ThreadEngine) -> RouteTable:
    return App(Config(), engine).table


def generating_app(engine: ThreadEngine, max_tokens: int = 50) -> Any:
    """The one line of wiring the real App has: the handler tracks the engine's stream."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # the body, as App reads it before it parses and submits
        request = Request(id="req-1", prompt_tokens=(5, 6, 7), max_tokens=max_tokens)
        stream: Any = record_of(scope).track(engine.submit([request]))  # the writer's duck
        await stream_sse(receive, send, stream, Frames(), 15.0)

    return app


def samples(text: str) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


async def scrape(metrics: Metrics, engine: ThreadEngine) -> dict[str, float]:
    r = await call(App(Config(), engine, metrics), "GET", "/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return samples(r.body.decode())


def test_metrics_stream_counts_tokens_ttft_itl_and_finish_reason() -> None:
    engine, _ = fake_engine([f"t{i} " for i in range(6)], step_s=0.01)

    async def go() -> dict[str, float]:
        engine.start()
        await engine.wait_ready()
        metrics = Metrics()
        app = RequestObserver(generating_app(engine), metrics, table=table_of(engine))
        r = await call(app, "POST", "/v1/chat/completions")
        assert r.sse_data()[-1] == "finish stop"
        for _ in range(100):  # the engine thread retires the row just after its last event
            m = await scrape(metrics, engine)
            if m["mlx_serve:num_requests_running"] == 0:
                break
            await asyncio.sleep(0.02)
        return m

    m = asyncio.run(go())
    assert m["mlx_serve:request_success_total{finished_reason=stop}"] == 1
    assert m["mlx_serve:prompt_tokens_total"] == 3
    assert m["mlx_serve:generation_tokens_total"] == 7  # six pieces and the EOS
    assert m["mlx_serve:time_to_first_token_seconds_count"] == 1
    assert m["mlx_serve:inter_token_latency_seconds_count"] == 5  # gaps between six deltas
    assert m["mlx_serve:inter_token_latency_seconds_sum"] > 0.02
    assert m["mlx_serve:time_per_output_token_seconds_count"] == 1
    assert m["mlx_serve:e2e_request_latency_seconds_count"] == 1
    assert m["mlx_serve:http_requests_total{endpoint=/v1/chat/completions,method=POST,status=200}"] == 1
    assert m["mlx_serve:engine_ready"] == 1 and m["mlx_serve:engine_restarts_total"] == 0
    assert m["mlx_serve:num_requests_running"] == 0 and m["mlx_serve:num_requests_waiting"] == 0


def test_metrics_client_disconnect_counts_as_abort() -> None:
    engine, _ = fake_engine([f"t{i} " for i in range(300)], step_s=0.01)

    async def go() -> dict[str, float]:
        engine.start()
        await engine.wait_ready()
        metrics = Metrics()
        await call(
            RequestObserver(generating_app(engine, 400), metrics, table=table_of(engine)),
            "POST",
            "/v1/completions",
            disconnect_after_chunks=3,
        )
        await wait_until(lambda: engine.counters.requests_aborted == 1)
        return await scrape(metrics, engine)

    m = asyncio.run(go())
    assert m["mlx_serve:request_success_total{finished_reason=abort}"] == 1
    assert m["mlx_serve:http_requests_total{endpoint=/v1/completions,method=POST,status=200}"] == 1


def test_metrics_running_gauge_during_a_stream() -> None:
    engine, _ = fake_engine([f"t{i} " for i in range(200)], step_s=0.01)

    async def go() -> tuple[dict[str, float], dict[str, float]]:
        engine.start()
        await engine.wait_ready()
        drain = Drain()
        metrics = Metrics(in_flight=drain.__len__)
        app = RequestObserver(generating_app(engine, 400), metrics, drain, table=table_of(engine))
        task = asyncio.create_task(call(app, "POST", "/v1/chat/completions", timeout_s=30))
        await wait_until(lambda: engine.counters.generated_tokens > 3)
        during = await scrape(metrics, engine)
        drain.begin(0.0)
        await task
        await wait_until(lambda: engine.counters.num_requests_running == 0)  # the engine's next step
        return during, await scrape(metrics, engine)

    during, after = asyncio.run(go())
    assert during["mlx_serve:num_requests_running"] == 1 and during["mlx_serve:num_requests_waiting"] == 0
    assert after["mlx_serve:num_requests_running"] == 0


def test_drain_ends_open_stream_with_error_frame_and_aborts_engine() -> None:
    engine, _ = fake_engine([f"t{i} " for i in range(500)], step_s=0.01)

    async def go() -> Any:
        engine.start()
        await engine.wait_ready()
        drain = Drain()
        app = RequestObserver(generating_app(engine, 600), Metrics(), drain, table=table_of(engine))
        task = asyncio.create_task(call(app, "POST", "/v1/chat/completions", timeout_s=30))
        await wait_until(lambda: engine.counters.generated_tokens > 3)
        drain.begin(0.2)
        reply = await task
        await wait_until(lambda: engine.counters.requests_aborted == 1)
        return reply

    r = asyncio.run(go())
    lines = r.sse_data()
    assert lines[-1].startswith("error 503 the server is shutting down")
    assert sum(ln.startswith("delta") for ln in lines) < 400
    assert engine.counters.requests_finished == 0


def test_drain_lets_short_stream_finish_and_refuses_new_requests() -> None:
    engine, _ = fake_engine(["a", "b", "c"], step_s=0.01)

    async def go() -> tuple[Any, Any]:
        engine.start()
        await engine.wait_ready()
        drain = Drain()
        app = RequestObserver(generating_app(engine), Metrics(), drain, table=table_of(engine))
        task = asyncio.create_task(call(app, "POST", "/v1/chat/completions"))
        await wait_until(lambda: len(drain) == 1)
        drain.begin(5.0)
        finished = await task
        try:
            await call(app, "POST", "/v1/chat/completions")
        except ServeError as exc:  # the real App turns this into a 503 in the route's format
            return finished, exc
        return finished, None

    finished, refused = asyncio.run(go())
    assert finished.sse_data()[-1] == "finish stop"
    assert refused is not None and refused.status == 503


def test_metrics_endpoint_serves_prometheus_text_beside_the_app() -> None:
    engine, _ = fake_engine(["a"])

    async def go() -> tuple[Any, Any]:
        metrics = Metrics()
        app = App(Config(), engine, metrics)
        engine.start()
        await engine.wait_ready()
        stack = RequestObserver(app, metrics)
        health = await call(stack, "GET", "/health")
        await call(stack, "GET", "/nope/secret-1")
        return health, await call(stack, "GET", "/metrics")

    health, r = asyncio.run(go())
    assert health.status == 200
    m = samples(r.body.decode())
    assert m["mlx_serve:http_requests_total{endpoint=/health,method=GET,status=200}"] == 1
    assert m["mlx_serve:http_requests_total{endpoint=other,method=GET,status=404}"] == 1
    assert m["mlx_serve:kv_cache_usage_perc"] == 0  # reported by the engine; nothing is held at idle


def test_metrics_engine_numbers_when_reported() -> None:
    class Reporting:
        state = EngineState.READY

        async def stats(self) -> dict[str, Any]:
            return {
                "num_requests_running": 3,
                "num_requests_waiting": 2,
                "kv_cache_usage_perc": 0.25,
                "restarts": 1,
                "spec_decode_num_accepted_tokens": 40,
                "spec_decode_num_draft_tokens": 60,
            }

    async def go() -> dict[str, float]:
        r = await call(App(Config(), Reporting(), Metrics()), "GET", "/metrics")  # type: ignore[arg-type]
        return samples(r.body.decode())

    m = asyncio.run(go())
    assert m["mlx_serve:num_requests_running"] == 3 and m["mlx_serve:num_requests_waiting"] == 2
    assert m["mlx_serve:kv_cache_usage_perc"] == 0.25
    assert m["mlx_serve:engine_restarts_total"] == 1
    assert m["mlx_serve:spec_decode_num_accepted_tokens_total"] == 40


def test_metrics_prefix_cache_holding_as_gauges() -> None:
    class Reporting:
        state = EngineState.READY

        async def stats(self) -> dict[str, Any]:
            return {"num_requests_running": 0, "prefix_cache_bytes": 2_097_152, "prefix_cache_blocks": 3}

    async def go() -> str:
        r = await call(App(Config(), Reporting(), Metrics()), "GET", "/metrics")  # type: ignore[arg-type]
        return r.body.decode()

    text = asyncio.run(go())
    m = samples(text)
    assert m["mlx_serve:prefix_cache_bytes"] == 2_097_152 and m["mlx_serve:prefix_cache_blocks"] == 3
    assert "# TYPE mlx_serve:prefix_cache_bytes gauge" in text


def test_metrics_count_prompt_tokens_by_where_their_kv_came_from() -> None:
    class Reporting:
        state = EngineState.READY

        async def stats(self) -> dict[str, Any]:
            return {"prompt_tokens": 1000, "prefill_tokens": 300, "prompt_tokens_from_disk": 200}

    async def go() -> dict[str, float]:
        r = await call(App(Config(), Reporting(), Metrics()), "GET", "/metrics")  # type: ignore[arg-type]
        return samples(r.body.decode())

    m = asyncio.run(go())
    assert m["mlx_serve:prompt_tokens_by_source_total{source=cached_memory}"] == 500
    assert m["mlx_serve:prompt_tokens_by_source_total{source=cached_disk}"] == 200
    assert m["mlx_serve:prompt_tokens_by_source_total{source=computed}"] == 300


def test_running_and_waiting_derived_from_counters() -> None:
    stats = {"requests_started": 5, "requests_finished": 2, "requests_aborted": 1, "requests_failed": 0}
    assert running_and_waiting(stats, in_flight=4) == (2, 2)
    assert running_and_waiting({}, in_flight=3) == (0, 3)


def test_route_label_bounds_cardinality() -> None:
    table = App(Config(), fake_engine(["a"])[0]).table
    assert table.match("POST", "/v1/chat/completions/").label == "/v1/chat/completions"
    assert table.match("GET", "/v1/models/some-model").label == "/v1/models/{model_id}"
    assert table.match("GET", "/wp-admin/x.php").label == "other"
    assert method_label("GET") == "GET" and method_label("BREW") == method_label("X-1") == "OTHER"


def test_request_log_line_and_trace(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    engine, _ = fake_engine(["a", "b"], step_s=0.01)
    trace_path = tmp_path / "trace.jsonl"

    async def go() -> None:
        engine.start()
        await engine.wait_ready()
        trace = TraceWriter(str(trace_path))
        app = RequestObserver(generating_app(engine), Metrics(), trace=trace, table=table_of(engine))
        await call(app, "POST", "/v1/chat/completions")
        await call(RequestObserver(App(Config(), engine), Metrics(), trace=trace), "GET", "/health")
        trace.close()

    with caplog.at_level(logging.INFO, logger="mlx_serve.access"):
        asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if r.name == "mlx_serve.access"]
    assert len(lines) == 1  # /health is logged at DEBUG only
    line = lines[0]
    for part in (
        "request id=req-1 ",
        "route=/v1/chat/completions",
        "status=200",
        "finish=stop",
        "prompt_tokens=3",
        "completion_tokens=3",
        "ttft_ms=",
        "duration_ms=",
    ):
        assert part in line, line
    traced = [orjson.loads(x) for x in trace_path.read_bytes().splitlines()]
    assert len(traced) == 1
    t = traced[0]
    assert t["id"] == "req-1" and t["status"] == 200 and t["outcome"] == "stop"
    p = t["phases_s"]
    assert (
        0
        <= p["body_read"]
        <= p["submitted"]
        <= p["first_token"]
        <= p["last_token"]
        <= p["last_write"]
        <= p["end"]
    )
    assert t["completion_tokens"] == 3 and t["inter_token_s"]["n"] == 1


def test_metrics_summary_for_stats_json() -> None:
    metrics = Metrics()
    choice = ChoiceDone("length", 4, 0.25, (0.1, 0.3, 0.2))
    metrics.observe(RequestDone("/v1/completions", "POST", 200, 1.5, 10, 6, (choice,)))
    metrics.observe(RequestDone("/v1/models", "GET", 401, 0.001))
    s = metrics.summary()
    assert s["http_requests"] == {"/v1/completions POST 200": 1.0, "/v1/models GET 401": 1.0}
    assert s["finished"] == {"length": 1.0}
    assert (s["prompt_tokens"], s["generation_tokens"], s["prefix_cache_hits"]) == (10, 4, 6)
    assert s["ttft_s"] == {"count": 1, "mean": 0.25} and s["inter_token_s"]["count"] == 3
    assert s["e2e_s"] == {"count": 1, "mean": 1.5}


def test_metric_series_stay_bounded_under_random_methods_and_unauthenticated_requests() -> None:
    # Issue 15 item 8: 1,000 random HTTP methods added 1,001 series to http_requests_total,
    # 300 of them from requests without a key on a keyed server.
    import random

    from mlx_serve.server.auth import ApiKeys, AuthMiddleware
    from mlx_serve.server.routes import KNOWN_METHODS, OTHER

    rng = random.Random(15)
    engine, _ = fake_engine(["a"])
    paths = ["/health", "/v1/models", "/v1/chat/completions", "/wp-login.php", "/v1/nope/x", "/"]

    async def go() -> dict[str, float]:
        metrics = Metrics()
        app = App(Config(), engine, metrics)
        engine.start()
        await engine.wait_ready()
        stack = RequestObserver(AuthMiddleware(app, ApiKeys(["secret"]), app.table), metrics, table=app.table)
        for i in range(1000):
            method = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ-_") for _ in range(rng.randint(1, 12)))
            keyed = [(b"authorization", b"Bearer secret")] if i % 10 < 7 else []  # 300 without a key
            await call(stack, method, rng.choice(paths), headers=keyed)
        return samples((await call(stack, "GET", "/metrics")).body.decode())

    m = asyncio.run(go())
    series = [k for k in m if k.startswith("mlx_serve:http_requests_total{")]
    labels = [dict(kv.split("=", 1) for kv in k[k.index("{") + 1 : -1].split(",")) for k in series]
    assert {lab["method"] for lab in labels} <= KNOWN_METHODS | {"OTHER"}
    assert {lab["endpoint"] for lab in labels} <= {
        r.metric_label for r in App(Config(), engine).table.routes
    } | {OTHER}
    assert len(series) <= 12  # a handful of (endpoint, method, status) triples, not one per method
    assert sum(m[k] for k in series) == 1000


def test_access_log_says_a_503_while_loading_once_not_for_every_poll(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine, _ = fake_engine(["hi"], step_s=0.0)
    body = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'

    async def go() -> list[int]:
        app = App(Config(), engine)
        observed = RequestObserver(app, Metrics(), table=app.table)
        statuses = []
        for _ in range(3):  # the engine is not started: every call is a 503 engine_unavailable
            statuses.append((await call(observed, "POST", "/v1/chat/completions", body=body)).status)
        engine.start()
        await engine.wait_ready()
        statuses.append((await call(observed, "POST", "/v1/chat/completions", body=body)).status)
        return statuses

    with caplog.at_level(logging.DEBUG, logger="mlx_serve.access"):
        statuses = asyncio.run(go())
    assert statuses == [503, 503, 503, 200]
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "mlx_serve.access"]
    assert [level for level, _ in lines] == [logging.INFO, logging.DEBUG, logging.DEBUG, logging.INFO]
    assert "status=503" in lines[0][1] and "status=200" in lines[3][1]
