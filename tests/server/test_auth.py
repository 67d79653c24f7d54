"""Tier 2: API keys on every API route, 401 in each route's own error shape, open probes."""

from __future__ import annotations

import asyncio
import hmac
from pathlib import Path
from typing import Any

import pytest

from mlx_serve.server.app import App
from mlx_serve.server.auth import ApiKeys, AuthMiddleware, KeyFileError, load_api_keys, presented_keys
from mlx_serve.server.cli import with_cors
from mlx_serve.server.config import Config, load_config
from tests.support.asgi import Reply, call
from tests.support.fake_engine import fake_engine

KEY = "sk-local-0123456789"
CHAT = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}'


def request(
    path: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    method: str = "GET",
    body: bytes = b"",
    **config: Any,
) -> Reply:
    engine, _ = fake_engine(["a"])
    cfg = Config(api_key=KEY, **config)

    async def go() -> Reply:
        app = App(cfg, engine)
        engine.start()
        await engine.wait_ready()
        stack = with_cors(
            AuthMiddleware(app, ApiKeys(load_api_keys(cfg, {})), app.table), cfg.allowed_origins
        )
        return await call(stack, method, path, body, headers=headers)

    return asyncio.run(go())


def test_auth_missing_key_is_401_in_openai_shape() -> None:
    r = request("/v1/chat/completions", method="POST", body=CHAT)
    assert r.status == 401 and r.headers["content-type"] == "application/json"
    assert r.headers["www-authenticate"].startswith("Bearer")
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == "invalid_api_key"
    assert "API key" in err["message"]


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_auth_missing_key_is_401_in_anthropic_shape(path: str) -> None:
    r = request(path, method="POST", body=b"{}")
    assert r.status == 401
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert "API key" in body["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/completions", "/v1/models", "/stats/"])
def test_auth_every_api_route_needs_the_key(path: str) -> None:
    r = request(path, method="POST" if path != "/v1/models" else "GET", body=b"{}", protect_metrics=True)
    assert r.status == 401 and "error" in r.json()


@pytest.mark.parametrize(
    "header",
    [
        (b"authorization", f"Bearer {KEY}".encode()),
        (b"authorization", f"bearer {KEY}".encode()),
        (b"x-api-key", KEY.encode()),
    ],
)
def test_auth_key_as_bearer_or_x_api_key_passes(header: tuple[bytes, bytes]) -> None:
    r = request("/v1/chat/completions", [header], method="POST", body=CHAT)
    assert r.status == 200 and r.json()["choices"][0]["message"]["content"] == "a"


@pytest.mark.parametrize(
    "header",
    [
        (b"authorization", b"Bearer sk-wrong"),
        (b"authorization", KEY.encode()),  # no scheme
        (b"authorization", f"Basic {KEY}".encode()),
        (b"x-api-key", KEY[:-1].encode()),
    ],
)
def test_auth_wrong_key_is_401(header: tuple[bytes, bytes]) -> None:
    assert request("/v1/models", [header]).status == 401


def test_auth_health_and_metrics_open_by_default_and_closable() -> None:
    assert request("/health").status == 200
    assert request("/stats").status == 200
    assert request("/health", protect_health=True).status == 401
    assert request("/stats", protect_metrics=True).status == 401
    assert request("/health", [(b"x-api-key", KEY.encode())], protect_health=True).status == 200
    engine, _ = fake_engine(["a"])
    open_routes = {r.path for r in App(Config(), engine).table.routes if r.open}
    assert open_routes == {"/health", "/metrics", "/stats", "/", "/ui/{name}"}  # the page loads without a key


def test_auth_cors_preflight_passes_without_key() -> None:
    r = request(
        "/v1/chat/completions",
        [(b"origin", b"https://app.example"), (b"access-control-request-method", b"POST")],
        method="OPTIONS",
        allowed_origins=["https://app.example"],
    )
    assert r.status == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in r.headers["access-control-allow-methods"]


def test_auth_401_carries_cors_headers_for_an_allowed_origin_only() -> None:
    allowed = [(b"origin", b"https://app.example")]
    r = request(
        "/v1/chat/completions", allowed, method="POST", body=CHAT, allowed_origins=["https://app.example"]
    )
    assert r.status == 401 and r.headers["access-control-allow-origin"] == "https://app.example"
    other = [(b"origin", b"https://evil.example")]
    r = request(
        "/v1/chat/completions", other, method="POST", body=CHAT, allowed_origins=["https://app.example"]
    )
    assert r.status == 401 and "access-control-allow-origin" not in r.headers


def test_auth_cors_preflight_from_a_disallowed_origin_is_refused() -> None:
    r = request(
        "/v1/chat/completions",
        [(b"origin", b"https://evil.example"), (b"access-control-request-method", b"POST")],
        method="OPTIONS",
        allowed_origins=["https://app.example"],
    )
    assert r.status == 400 and "access-control-allow-origin" not in r.headers


def test_auth_without_keys_everything_is_open() -> None:
    engine, _ = fake_engine(["a"])

    async def go() -> Reply:
        app = App(Config(), engine)
        engine.start()
        await engine.wait_ready()
        return await call(AuthMiddleware(app, ApiKeys([]), app.table), "GET", "/v1/models")

    assert asyncio.run(go()).status == 200


def test_auth_compares_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr("mlx_serve.server.auth.hmac.compare_digest", spy)
    keys = ApiKeys(["k1", "k2"])
    assert keys.check([b"k1"]) and not keys.check([b"nope"]) and not keys.check([])
    # every key is compared, whichever matches
    assert calls == [(b"k1", b"k1"), (b"k1", b"k2"), (b"nope", b"k1"), (b"nope", b"k2")]


def test_auth_keys_from_flag_file_and_env(tmp_path: Path) -> None:
    f = tmp_path / "keys"
    f.write_text("# rotated monthly\nsk-new\n\n  sk-old  \n")
    f.chmod(0o600)
    cfg = Config(api_key="sk-flag", api_key_file=str(f))
    assert load_api_keys(cfg, {"MLX_SERVE_API_KEY": "sk-env"}) == ["sk-flag", "sk-new", "sk-old", "sk-env"]
    assert load_api_keys(Config(), {}) == []


def test_auth_bad_key_file_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(KeyFileError, match="no key"):
        load_api_keys(Config(api_key_file=str(empty)), {})
    with pytest.raises(KeyFileError, match="missing"):
        load_api_keys(Config(api_key_file=str(tmp_path / "missing")), {})


def test_auth_presented_keys_reads_both_headers() -> None:
    headers = [(b"authorization", b"Bearer  a "), (b"x-api-key", b"b"), (b"accept", b"x")]
    assert presented_keys(headers) == [b"a", b"b"]


def test_config_deploy_flags(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = load_config(
        [
            "--api-key-file",
            "/k",
            "--protect-health",
            "--shutdown-timeout",
            "7",
            "--certfile",
            "c.pem",
            "--keyfile",
            "k.pem",
            "--trace",
            "t.jsonl",
        ]
    )
    assert (cfg.api_key_file, cfg.protect_health, cfg.shutdown_timeout_s) == ("/k", True, 7.0)
    assert (cfg.certfile, cfg.keyfile, cfg.trace) == ("c.pem", "k.pem", "t.jsonl")
    for bad in (["--certfile", "c.pem"], ["--api-key", ""], ["--shutdown-timeout-s", "-1"]):
        with pytest.raises(SystemExit):
            load_config(bad)


def test_auth_stored_responses_belong_to_the_key_that_made_them() -> None:
    engine, _ = fake_engine(["a"])
    alice, bob = (b"x-api-key", b"sk-alice"), (b"x-api-key", b"sk-bob")

    async def go() -> dict[str, Reply]:
        app = App(Config(), engine)
        engine.start()
        await engine.wait_ready()
        stack = AuthMiddleware(app, ApiKeys(["sk-alice", "sk-bob"]), app.table)
        made = await call(
            stack, "POST", "/v1/responses", b'{"input":"hi","max_output_tokens":3}', headers=[alice]
        )
        rid = made.json()["id"]
        go_on = f'{{"input":"more","previous_response_id":"{rid}","max_output_tokens":3}}'.encode()
        return {
            "made": made,
            "bob_get": await call(stack, "GET", f"/v1/responses/{rid}", headers=[bob]),
            "bob_continue": await call(stack, "POST", "/v1/responses", go_on, headers=[bob]),
            "bob_delete": await call(stack, "DELETE", f"/v1/responses/{rid}", headers=[bob]),
            "alice_get": await call(stack, "GET", f"/v1/responses/{rid}", headers=[alice]),
            "alice_continue": await call(stack, "POST", "/v1/responses", go_on, headers=[alice]),
            "alice_delete": await call(stack, "DELETE", f"/v1/responses/{rid}", headers=[alice]),
        }

    r = asyncio.run(go())
    assert r["made"].status == 200
    assert [r[k].status for k in ("bob_get", "bob_continue", "bob_delete")] == [404, 404, 404]
    assert r["bob_continue"].json()["error"]["param"] == "previous_response_id"
    assert [r[k].status for k in ("alice_get", "alice_continue", "alice_delete")] == [200, 200, 200]
    assert r["alice_get"].json()["id"] == r["made"].json()["id"]


SDK_PREFLIGHT_HEADERS = (  # what the official browser SDKs ask a preflight for (openai-node, anthropic-sdk-typescript)
    b"authorization,content-type,openai-organization,openai-project,x-stainless-arch,x-stainless-lang,"
    b"x-stainless-os,x-stainless-package-version,x-stainless-retry-count,x-stainless-runtime,"
    b"x-stainless-runtime-version,x-stainless-timeout,x-stainless-helper-method,anthropic-version,"
    b"anthropic-beta,anthropic-dangerous-direct-browser-access,x-api-key"
)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_auth_cors_preflight_of_the_browser_sdks_is_allowed(path: str) -> None:
    r = request(
        path,
        [
            (b"origin", b"https://app.example"),
            (b"access-control-request-method", b"POST"),
            (b"access-control-request-headers", SDK_PREFLIGHT_HEADERS),
        ],
        method="OPTIONS",
        allowed_origins=["https://app.example"],
    )
    assert r.status == 200, r.body
    assert r.headers["access-control-allow-origin"] == "https://app.example"
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert set(SDK_PREFLIGHT_HEADERS.decode().split(",")) <= allowed
