"""Tier 2: the page at / and its files — content types, caching, no key needed to load it,
nothing outside server/static reachable, --no-ui; and GET /stats/recent behind the key."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from mlx_serve.server.app import App
from mlx_serve.server.cli import serving_stack
from mlx_serve.server.config import Config, load_config
from mlx_serve.server.page import STATIC_DIR
from mlx_serve.server.shutdown import Drain
from tests.support.asgi import Reply, call
from tests.support.fake_engine import fake_engine
from tests.support.hypercorn_app import hypercorn_serving

KEY = "sk-page-0123456789"
BEARER = [(b"authorization", f"Bearer {KEY}".encode())]
CHAT = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":3}'
STATIC_FILES = sorted(p.name for p in STATIC_DIR.iterdir())


def stacked(**config: Any) -> tuple[Any, App]:
    engine, _ = fake_engine(["a", "b", "c"])
    cfg = Config(api_key=KEY, **config)
    app = App(cfg, engine)
    stack, _ = serving_stack(app, cfg, Drain())
    return stack, app


def calls(requests: list[tuple[str, str, bytes, list[tuple[bytes, bytes]]]], **config: Any) -> list[Reply]:
    """Each request in turn through the whole serving stack (keys, records) of one app."""

    async def go() -> list[Reply]:
        stack, app = stacked(**config)
        app.engine.start()
        await app.engine.wait_ready()
        try:
            return [await call(stack, m, p, b, headers=h) for m, p, b, h in requests]
        finally:
            app.engine.stop()

    return asyncio.run(go())


def get(path: str, headers: list[tuple[bytes, bytes]] | None = None, **config: Any) -> Reply:
    return calls([("GET", path, b"", headers or [])], **config)[0]


def test_page_index_loads_without_a_key_as_html_with_its_policy() -> None:
    r = get("/")
    assert r.status == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.body == (STATIC_DIR / "index.html").read_bytes()
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["cache-control"] == "no-cache" and r.headers["etag"].startswith('"')


@pytest.mark.parametrize(
    ("name", "content_type"),
    [
        ("page.css", "text/css; charset=utf-8"),
        ("main.js", "text/javascript; charset=utf-8"),
        ("status.js", "text/javascript; charset=utf-8"),
        ("chat.js", "text/javascript; charset=utf-8"),
        ("api.js", "text/javascript; charset=utf-8"),
        ("favicon.svg", "image/svg+xml"),
    ],
)
def test_page_files_have_their_content_types(name: str, content_type: str) -> None:
    r = get(f"/ui/{name}")
    assert r.status == 200 and r.headers["content-type"] == content_type
    assert r.body == (STATIC_DIR / name).read_bytes()
    assert int(r.headers["content-length"]) == len(r.body)


def test_page_every_file_it_loads_is_served() -> None:
    """index.html and the modules name only files the server has (and only on its own origin)."""
    html = (STATIC_DIR / "index.html").read_text()
    scripts = "".join((STATIC_DIR / n).read_text() for n in STATIC_FILES if n.endswith(".js"))
    assert "http://" not in html + scripts and "https://" not in html + scripts
    for name in STATIC_FILES:
        if name != "index.html":
            assert f"/ui/{name}" in html or f"./{name}" in scripts, name


def test_page_unchanged_file_is_304_without_a_body() -> None:
    first = get("/ui/main.js")
    r = get("/ui/main.js", [(b"if-none-match", first.headers["etag"].encode())])
    assert r.status == 304 and r.body == b""
    assert get("/ui/main.js", [(b"if-none-match", b'"stale"')]).status == 200


def test_page_head_answers_headers_only() -> None:
    r = calls([("HEAD", "/", b"", [])])[0]
    assert r.status == 200 and r.body == b"" and r.headers["content-type"].startswith("text/html")


@pytest.mark.parametrize(
    "path",
    [
        "/ui/..",
        "/ui/../page.py",
        "/ui/../../pyproject.toml",
        "/ui/%2e%2e%2fpage.py",
        "/ui/page.py",
        "/ui/recent.py",
        "/ui/",
        "/ui/.",
        "/ui//etc/passwd",
        "/ui/static",
        "/index.html/../page.py",
        "/static/index.html",
        "/server/page.py",
    ],
)
def test_page_serves_nothing_outside_its_files(path: str) -> None:
    r = get(path, BEARER)
    assert r.status == 404
    assert r.headers["content-type"] == "application/json" and r.json()["error"]["message"]
    assert b"import" not in r.body and b"[project]" not in r.body


def test_page_traversal_through_a_real_hypercorn_is_404() -> None:
    """Raw request lines, as a scanner sends them: Hypercorn decodes %2e and %2f before routing."""
    engine, _ = fake_engine(["a"])
    cfg = Config()
    app = App(cfg, engine)
    stack, _ = serving_stack(app, cfg, Drain())
    targets = [
        "/ui/../page.py",
        "/ui/%2e%2e/page.py",
        "/ui/..%2fpage.py",
        "/ui/%2e%2e%2f%2e%2e%2fpyproject.toml",
    ]
    with hypercorn_serving(stack) as url:
        host, port = url.removeprefix("http://").split(":")
        for target in targets:
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                answer = b""
                while chunk := s.recv(65536):
                    answer += chunk
            assert answer.startswith(b"HTTP/1.1 404"), (target, answer[:200])
            assert b"import" not in answer, target


def test_page_data_calls_need_the_key() -> None:
    without = calls([("GET", p, b"", []) for p in ("/stats/recent", "/v1/models")])
    assert [r.status for r in without] == [401, 401]
    with_key = calls([("GET", p, b"", BEARER) for p in ("/stats/recent", "/v1/models")])
    assert [r.status for r in with_key] == [200, 200]


def test_page_no_ui_flag_makes_the_page_404_as_before() -> None:
    assert load_config([]).ui is True and load_config(["--no-ui"]).ui is False
    for path in ("/", "/ui/main.js", "/ui/page.css"):
        r = get(path, BEARER, ui=False)
        assert r.status == 404 and r.headers["content-type"] == "application/json", path
    assert get("/stats/recent", BEARER, ui=False).status == 200  # the endpoint is the API's


def test_stats_recent_lists_model_calls_newest_first_without_the_page_polls() -> None:
    bad = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"top_k":-4}'
    replies = calls(
        [
            ("POST", "/v1/chat/completions", CHAT, BEARER),
            ("GET", "/", b"", []),
            ("GET", "/stats", b"", BEARER),
            ("POST", "/wp-login.php", b"", BEARER),
            ("POST", "/v1/chat/completions", bad, BEARER),
            ("GET", "/stats/recent", b"", BEARER),
        ]
    )
    assert [r.status for r in replies] == [200, 200, 200, 404, 400, 200]
    recent = replies[-1].json()
    assert recent["in_flight"] == []
    refused, served = recent["ended"]
    assert refused["status"] == 400 and refused["refusal"] == "invalid_request param=top_k"
    assert served["route"] == "/v1/chat/completions" and served["status"] == 200
    assert served["phase"] == "done" and served["outcome"] == "length"
    assert served["completion_tokens"] == 3 and served["prompt_tokens"] > 0
    phases = served["phases_s"]
    assert 0 <= phases["submitted"] <= phases["first_token"] <= phases["last_token"] <= phases["end"]
    assert served["ttft_s"] == pytest.approx(phases["first_token"], abs=1e-3)
    assert served["elapsed_s"] >= phases["last_token"]


def test_stats_recent_keeps_the_last_fifty() -> None:
    replies = calls(
        [("POST", "/v1/chat/completions", CHAT, BEARER)] * 53 + [("GET", "/stats/recent", b"", BEARER)]
    )
    ended = replies[-1].json()["ended"]
    assert len(ended) == 50
    arrived = [e["arrived_unix"] for e in ended]
    assert arrived == sorted(arrived, reverse=True)


def test_stats_recent_shows_a_request_in_flight_with_its_phase() -> None:
    async def go() -> tuple[dict[str, Any], Reply]:
        engine, _ = fake_engine([str(i % 10) for i in range(200)], step_s=0.01)
        cfg = Config(api_key=KEY)
        app = App(cfg, engine)
        stack, _ = serving_stack(app, cfg, Drain())
        engine.start()
        await engine.wait_ready()
        body = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":150,"stream":true}'
        streaming = asyncio.create_task(call(stack, "POST", "/v1/chat/completions", body, headers=BEARER))
        for _ in range(200):
            await asyncio.sleep(0.02)
            snapshot = (await call(stack, "GET", "/stats/recent", headers=BEARER)).json()
            if snapshot["in_flight"] and snapshot["in_flight"][0]["completion_tokens"] > 2:
                break
        done = await streaming
        engine.stop()
        return snapshot, done

    snapshot, done = asyncio.run(go())
    assert done.status == 200
    live = snapshot["in_flight"][0]
    assert live["phase"] == "decoding" and live["status"] is None
    assert live["route"] == "/v1/chat/completions" and live["completion_tokens"] > 2
    assert live["ttft_s"] is not None and live["elapsed_s"] >= live["ttft_s"]


def test_page_files_are_package_data() -> None:
    """An installed wheel carries every file the page serves (pyproject's package-data globs)."""
    import fnmatch
    import tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["mlx_serve.server"]
    for name in STATIC_FILES:
        assert any(fnmatch.fnmatch(f"static/{name}", g) for g in globs), name
