"""Tier 3: a real mlx-serve with an API key, --trace and /metrics, asked by the official SDKs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.server_proc import ServerProcess

FILE_KEY, ENV_KEY = "sk-from-file-1", "sk-from-env-2"
ALLOWED, OTHER = "https://app.example", "https://evil.example"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("keys")


@pytest.fixture(scope="module")
def server(smollm_path: Path, folder: Path) -> Iterator[ServerProcess]:
    keys = folder / "keys"
    keys.write_text(f"# one key a line\n{FILE_KEY}\n")
    keys.chmod(0o600)
    s = ServerProcess(
        [
            "--model",
            str(smollm_path),
            "--api-key-file",
            str(keys),
            "--trace",
            str(folder / "trace.jsonl"),
            "--allowed-origins",
            ALLOWED,
        ],
        folder / "server.log",
        env={"MLX_SERVE_API_KEY": ENV_KEY},
    )
    yield s
    s.close()


def metric_samples(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_sdks_get_401_in_their_own_format(server: ServerProcess) -> None:
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as oe:
        oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert oe.value.status_code == 401 and "API key" in oe.value.message
    assert oe.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    an = anthropic.Anthropic(base_url=server.url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as ae:
        an.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert ae.value.status_code == 401
    assert ae.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_cors_over_real_http_preflight_and_401(server: ServerProcess) -> None:
    """A browser sees the 401 body (not a CORS failure) from an allowed origin, and nothing from another."""
    url = server.url + "/v1/chat/completions"
    pre = {
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization,content-type",
    }
    ok = httpx.options(url, headers={"origin": ALLOWED, **pre}, timeout=10)
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ALLOWED
    assert "POST" in ok.headers["access-control-allow-methods"]
    assert "authorization" in ok.headers["access-control-allow-headers"].lower()
    bad = httpx.options(url, headers={"origin": OTHER, **pre}, timeout=10)
    assert bad.status_code == 400 and "access-control-allow-origin" not in bad.headers
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    r = httpx.post(url, json=body, headers={"origin": ALLOWED}, timeout=10)
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ALLOWED
    assert r.json()["error"]["code"] == "invalid_api_key"
    r = httpx.post(url, json=body, headers={"origin": OTHER}, timeout=10)
    assert r.status_code == 401 and "access-control-allow-origin" not in r.headers
    m = httpx.post(server.url + "/v1/messages", json={}, headers={"origin": ALLOWED}, timeout=10)
    assert m.status_code == 401 and m.headers["access-control-allow-origin"] == ALLOWED
    assert m.json()["error"]["type"] == "authentication_error"


def test_keys_from_file_and_env_both_work(server: ServerProcess) -> None:
    for key in (FILE_KEY, ENV_KEY):
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
        r = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Hi"}], max_tokens=3
        )
        assert r.choices[0].message.content is not None
    assert httpx.get(server.url + "/health").status_code == 200  # probes stay open


def test_metrics_count_a_streamed_request(server: ServerProcess) -> None:
    before = metric_samples(server.url)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=FILE_KEY, max_retries=0)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Tell a story."}], max_tokens=8, stream=True
    )
    assert sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content) >= 2
    # The request is counted as the server finishes with it, just after the response's last byte
    # (as the trace line is, below): the client may hold the whole stream a moment before that.
    done = "mlx_serve:e2e_request_latency_seconds_count"
    deadline = time.monotonic() + 10
    while True:
        m = metric_samples(server.url)
        if m.get(done, 0.0) > before.get(done, 0.0) or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    def grew(name: str) -> float:
        return m.get(name, 0.0) - before.get(name, 0.0)

    assert grew("mlx_serve:http_requests_total{endpoint=/v1/chat/completions,method=POST,status=200}") == 1
    assert grew("mlx_serve:request_success_total{finished_reason=length}") == 1
    assert grew("mlx_serve:generation_tokens_total") == 8
    assert grew("mlx_serve:prompt_tokens_total") > 5
    assert grew("mlx_serve:time_to_first_token_seconds_count") == 1
    assert grew("mlx_serve:inter_token_latency_seconds_count") >= 1
    assert grew("mlx_serve:e2e_request_latency_seconds_count") == 1
    assert m["mlx_serve:engine_ready"] == 1 and m["mlx_serve:num_requests_running"] == 0


def test_trace_and_log_line_per_request(server: ServerProcess, folder: Path) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=FILE_KEY, max_retries=0)
    r = client.completions.create(model="m", prompt="Once upon a time", max_tokens=4)
    # The trace line and the log line are written as the server finishes with the request, which
    # (its "end" phase) is after the response's last byte: the client may hold the whole response
    # a moment before they exist.
    deadline = time.monotonic() + 10
    while True:
        lines = [orjson.loads(x) for x in (folder / "trace.jsonl").read_bytes().splitlines()]
        mine = [t for t in lines if t["id"] == r.id]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert len(mine) == 1, lines[-3:]
    t = mine[0]
    assert t["route"] == "/v1/completions" and t["status"] == 200 and t["completion_tokens"] == 4
    p = t["phases_s"]
    assert (
        p["body_read"] <= p["submitted"] <= p["first_token"] <= p["last_token"] <= p["last_write"] <= p["end"]
    )
    engine = t["engine_s"][0]  # admission wait, prefill chunks and first token, from the engine
    assert 0 <= engine["admission_wait"] <= engine["first_token"] <= engine["finished"]
    # the engine (a child process here) took the request in after the server read it (the server
    # notes "submitted" once the hand-over returns, which may be later), and its first token
    # reached the server after the engine made it: one clock across processes
    assert p["body_read"] <= engine["engine_in"] <= p["first_token"]
    assert engine["engine_in"] + engine["first_token"] <= p["first_token"]
    # the first delta the engine sent (its text, once whole) left after the first token and before
    # the server had it
    assert engine["first_token"] <= engine["first_delta"] <= p["first_token"] - engine["engine_in"]
    assert sum(n for n, _ in engine["prefill_chunks"]) >= 1 and all(
        s > 0 for _, s in engine["prefill_chunks"]
    )
    logged = [ln for ln in server.log().splitlines() if f"request id={r.id} " in ln]
    assert len(logged) == 1 and "status=200" in logged[0] and "completion_tokens=4" in logged[0]
    assert "ttft_ms=" in logged[0] and "duration_ms=" in logged[0]
