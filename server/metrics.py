"""Prometheus metrics under `mlx_serve:`, named after vLLM's (`vllm:` → `mlx_serve:`).

Request-level series (latency histograms, tokens, finish reasons, HTTP statuses) are observed
by the server when a request ends; engine-level ones (running/waiting requests, KV usage,
restarts, speculation) are read from `engine.stats()` at each scrape, so they are never stale.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
# vLLM's buckets, trimmed to what a Mac's token rates can produce.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000)
# Engine counters passed through when the engine reports them (speculation, preemption).
ENGINE_GAUGES = {
    "prefix_cache_bytes": "Bytes the prefix cache holds in memory.",
    "prefix_cache_blocks": "Blocks the prefix cache holds in memory (entries, where caches are not cut in blocks).",
}
ENGINE_COUNTERS = {
    "spec_decode_num_drafts": "Speculative decoding: draft rounds.",
    "spec_decode_num_draft_tokens": "Speculative decoding: tokens proposed by the drafter.",
    "spec_decode_num_accepted_tokens": "Speculative decoding: draft tokens accepted by the target.",
    "num_preemptions": "Requests preempted to free KV memory.",
    "engine_steps": "Engine steps run (one batched forward each).",
    "engine_step_rows": "Decoding rows summed over engine steps (divided by engine_steps: the mean batch width).",
    "engine_join_steps": "Engine steps that carried prompt chunks (prefill).",
    "engine_step_seconds": "Wall time inside engine steps.",
    "engine_join_step_seconds": "Wall time inside engine steps that carried prompt chunks.",
}


@dataclass(frozen=True, slots=True)
class ChoiceDone:
    """One generated choice as it ended: its finish reason and token timings."""

    finished_reason: str  # stop | length | tool_calls | abort | error
    completion_tokens: int
    ttft_s: float | None
    inter_token_s: tuple[float, ...]  # gaps between streamed deltas


@dataclass(frozen=True, slots=True)
class RequestDone:
    """One HTTP request as it ended; `choices` is empty for routes that generate nothing."""

    route: str
    method: str
    status: int
    duration_s: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    choices: tuple[ChoiceDone, ...] = ()


class StatsSource(Protocol):
    """What metrics need of an engine (every EngineClient fits)."""

    @property
    def state(self) -> enum.Enum: ...

    async def stats(self) -> dict[str, Any]: ...


class Metrics:
    """The server's metrics and its own registry (no process-global state)."""

    content_type = CONTENT_TYPE

    def __init__(self, in_flight: Callable[[], int] = lambda: 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.engine = EngineCollector(in_flight)
        self.registry.register(self.engine)
        r = self.registry
        self.http_requests = Counter(
            "mlx_serve:http_requests",
            "HTTP requests by endpoint, method and status.",
            ["endpoint", "method", "status"],
            registry=r,
        )
        self.request_success = Counter(
            "mlx_serve:request_success",
            "Finished generations by finish reason.",
            ["finished_reason"],
            registry=r,
        )
        self.prompt_tokens = Counter("mlx_serve:prompt_tokens", "Prompt tokens processed.", registry=r)
        self.generation_tokens = Counter("mlx_serve:generation_tokens", "Tokens generated.", registry=r)
        self.prefix_cache_queries = Counter(
            "mlx_serve:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", registry=r
        )
        self.prefix_cache_hits = Counter(
            "mlx_serve:prefix_cache_hits", "Prompt tokens found in the prefix cache.", registry=r
        )
        self.ttft = Histogram(
            "mlx_serve:time_to_first_token_seconds", "Time to first token.", buckets=TTFT_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "mlx_serve:inter_token_latency_seconds",
            "Time between streamed tokens.",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "mlx_serve:time_per_output_token_seconds",
            "Mean time per output token after the first, per request.",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "mlx_serve:e2e_request_latency_seconds",
            "End-to-end request latency.",
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.request_prompt_tokens = Histogram(
            "mlx_serve:request_prompt_tokens", "Prompt tokens per request.", buckets=TOKEN_BUCKETS, registry=r
        )
        self.request_generation_tokens = Histogram(
            "mlx_serve:request_generation_tokens",
            "Generated tokens per request.",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )

    def observe(self, done: RequestDone) -> None:
        """Count one finished HTTP request."""
        self.http_requests.labels(done.route, done.method, str(done.status)).inc()
        if not done.choices:
            return
        self.e2e.observe(done.duration_s)
        self.prompt_tokens.inc(done.prompt_tokens)
        self.request_prompt_tokens.observe(done.prompt_tokens)
        self.prefix_cache_queries.inc(done.prompt_tokens)
        self.prefix_cache_hits.inc(done.cached_tokens)
        for choice in done.choices:
            self._observe_choice(choice)

    def _observe_choice(self, choice: ChoiceDone) -> None:
        self.request_success.labels(choice.finished_reason).inc()
        self.generation_tokens.inc(choice.completion_tokens)
        self.request_generation_tokens.observe(choice.completion_tokens)
        if choice.ttft_s is not None:
            self.ttft.observe(choice.ttft_s)
        for gap in choice.inter_token_s:
            self.itl.observe(gap)
        if choice.inter_token_s:
            self.tpot.observe(sum(choice.inter_token_s) / len(choice.inter_token_s))

    def summary(self) -> dict[str, Any]:
        """The request-level series as JSON for people (/stats): totals, and histogram means."""
        out: dict[str, Any] = {"http_requests": {}, "finished": {}}
        for family in (self.http_requests, self.request_success):
            for metric in family.collect():
                for s in metric.samples:
                    if s.name.endswith("_total"):
                        key = " ".join(s.labels.values())
                        out["http_requests" if family is self.http_requests else "finished"][key] = s.value
        for name, counter in (
            ("prompt_tokens", self.prompt_tokens),
            ("generation_tokens", self.generation_tokens),
            ("prefix_cache_hits", self.prefix_cache_hits),
        ):
            out[name] = _sample(counter, "_total")
        for name, hist in (("ttft_s", self.ttft), ("inter_token_s", self.itl), ("e2e_s", self.e2e)):
            count, total = _sample(hist, "_count"), _sample(hist, "_sum")
            out[name] = {"count": count, "mean": round(total / count, 6) if count else None}
        return out

    async def render(self, source: StatsSource) -> bytes:
        """The Prometheus text exposition, with the engine's numbers asked for now."""
        try:
            stats = await source.stats()
        except Exception:  # noqa: BLE001 - a scrape must answer even while the engine restarts
            stats = {}
        self.engine.snapshot = {**stats, "state": source.state.value}
        return generate_latest(self.registry)


class EngineCollector:
    """Engine gauges and counters from the latest `engine.stats()` snapshot."""

    def __init__(self, in_flight: Callable[[], int]) -> None:
        self.snapshot: dict[str, Any] = {}
        self.in_flight = in_flight

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        running, waiting = running_and_waiting(s, self.in_flight())
        yield GaugeMetricFamily("mlx_serve:num_requests_running", "Requests in the running batch.", running)
        yield GaugeMetricFamily(
            "mlx_serve:num_requests_waiting", "Requests waiting for a batch slot.", waiting
        )
        yield GaugeMetricFamily(
            "mlx_serve:engine_ready",
            "1 while the engine serves, 0 while it loads, restarts or has failed.",
            1.0 if s.get("state", "ready") == "ready" else 0.0,
        )
        yield CounterMetricFamily(
            "mlx_serve:engine_restarts", "Times the engine process was restarted.", s.get("restarts", 0)
        )
        if "kv_cache_usage_perc" in s:
            yield GaugeMetricFamily(
                "mlx_serve:kv_cache_usage_perc", "KV cache usage (1 = full).", s["kv_cache_usage_perc"]
            )
        for key, doc in ENGINE_GAUGES.items():
            if key in s:
                yield GaugeMetricFamily(f"mlx_serve:{key}", doc, s[key])
        for key, doc in ENGINE_COUNTERS.items():
            if key in s:
                yield CounterMetricFamily(f"mlx_serve:{key}", doc, s[key])
        if "prefill_tokens" in s:
            yield prompt_tokens_by_source(s)


def prompt_tokens_by_source(s: Mapping[str, Any]) -> CounterMetricFamily:
    """Admitted requests' prompt tokens (aborted ones too) by where their KV came from."""
    family = CounterMetricFamily(
        "mlx_serve:prompt_tokens_by_source",
        "Prompt tokens of admitted requests by where their KV came from: the prompt cache in "
        "memory, its disk tier, or computed.",
        labels=["source"],
    )
    computed, disk = int(s.get("prefill_tokens", 0)), int(s.get("prompt_tokens_from_disk", 0))
    family.add_metric(["cached_memory"], max(0, int(s.get("prompt_tokens", 0)) - computed - disk))
    family.add_metric(["cached_disk"], disk)
    family.add_metric(["computed"], computed)
    return family


def running_and_waiting(stats: Mapping[str, Any], in_flight: int) -> tuple[int, int]:
    """The engine's own numbers when it gives them; else derived from its counters.

    Derived: rows admitted to the batch and not yet ended are running, and the server's other
    in-flight generations are waiting (or prefilling their first chunk).
    """
    if "num_requests_running" in stats:
        return int(stats["num_requests_running"]), int(stats.get("num_requests_waiting", 0))
    ended = sum(int(stats.get(k, 0)) for k in ("requests_finished", "requests_aborted", "requests_failed"))
    running = min(max(int(stats.get("requests_started", 0)) - ended, 0), in_flight)
    return running, in_flight - running


def _sample(metric: Counter | Histogram, suffix: str) -> float:
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith(suffix):
                return float(s.value)
    return 0.0
