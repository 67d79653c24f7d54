"""Tier 3: the page at / in a real headless Chromium (Debian's, driven by Playwright) against a
real server with SmolLM2 and an API key: it asks for the key, shows the model ready, streams a
playground answer equal to the API's greedy answer for the same body, lists the request, stops
a stream; the screenshot shows every part of it."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlx_serve.server.app import App
from mlx_serve.server.cli import serving_stack
from mlx_serve.server.config import Config
from mlx_serve.server.shutdown import Drain
from tests.support.fake_engine import fake_engine
from tests.support.hypercorn_app import hypercorn_serving
from tests.support.png import read_png
from tests.support.server_proc import ServerProcess

KEY = "sk-page-e2e-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
VIEWPORT = {"width": 1400, "height": 860}
# What a reader must see: the model and its state, the counters, the requests, the playground.
KEY_ELEMENTS = (
    "#model-name",
    "#model-state",
    "#card-speed",
    "#card-prefix",
    "#recent",
    "#messages",
    "#composer",
)


@pytest.fixture(scope="module")
def page_server(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`mlx-serve --api-key KEY`: the default model (SmolLM2, converted by `smollm_path`'s fixture)."""
    log = tmp_path_factory.mktemp("logs") / "page-server.log"
    server = ServerProcess(["--api-key", KEY], log, bare=True)
    yield server
    server.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    assert Path(chromium).exists(), "Debian's chromium is missing (scripts/test.sh installs it)"
    with pytest.MonkeyPatch.context() as env:
        env.delenv(
            "LD_PRELOAD", raising=False
        )  # OpenBLAS preloaded into Playwright's node breaks its threads
        playwright = sync_playwright().start()
        # --no-sandbox: Chromium's sandbox refuses to start as root, as CI runs.
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    yield launched
    launched.close()
    playwright.stop()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport=VIEWPORT)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    # The page runs under its own Content-Security-Policy: anything it breaks is logged here.
    opened.on("console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None)
    yield opened
    context.close()
    assert errors == [], errors


def wait_until(check: Any, timeout_s: float = 120.0) -> None:
    """Poll a condition read from the page (wait_for_function would eval, which the page's CSP forbids)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the page never got there"
        time.sleep(0.1)


def record_renders(page: Any) -> None:
    """Note the assistant text's length at every change to the conversation."""
    page.evaluate(
        """() => {
        window.renders = [];
        new MutationObserver(() => {
          const all = document.querySelectorAll(".msg.assistant .content");
          if (all.length) window.renders.push(all[all.length - 1].textContent.length);
        }).observe(document.getElementById("messages"), { subtree: true, childList: true, characterData: true });
      }"""
    )


def test_page_shows_the_model_ready_and_streams_the_greedy_answer(
    page_server: ServerProcess, page: Any, tmp_path: Path
) -> None:
    page.goto(page_server.url + "/")
    page.locator("#key-dialog").wait_for(state="visible")  # every data call needs the key
    page.fill("#key-input", KEY)
    page.click("#key-save")
    page.locator("#model-state[data-state=ready]").wait_for(timeout=60_000)
    listed = httpx.get(page_server.url + "/v1/models", headers=AUTH).json()["data"][0]["id"]
    assert page.text_content("#model-name") == listed == "SmolLM2-135M-Instruct"
    assert page.text_content("#model-state") == "ready"
    assert page.evaluate("localStorage.getItem('mlx-serve.api-key')") == KEY

    page.fill("#system", "You are a helpful assistant. Answer in one or two sentences.")
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "24")
    page.fill("#prompt", "Why is the sky blue?")
    record_renders(page)
    with page.expect_request("**/v1/chat/completions") as sent:
        page.click("#send")
    page.locator(".msg.assistant[data-done]").wait_for(timeout=120_000)
    streamed = page.text_content(".msg.assistant .content")

    body = json.loads(sent.value.post_data)
    assert body["stream"] is True and body["temperature"] == 0 and body["max_tokens"] == 24
    assert body["model"] == listed and body["messages"][0]["role"] == "system"
    assert sent.value.headers["authorization"] == f"Bearer {KEY}"
    whole = {k: v for k, v in body.items() if k != "stream_options"} | {"stream": False}
    answer = httpx.post(page_server.url + "/v1/chat/completions", json=whole, headers=AUTH, timeout=120)
    assert streamed == answer.json()["choices"][0]["message"]["content"] and len(streamed) > 20
    renders = [n for n in page.evaluate("window.renders") if n]
    assert len(set(renders)) >= 3 and renders[-1] == len(streamed)  # rendered as it arrived

    served = page.locator("#recent-rows tr", has_text="/v1/chat/completions").filter(
        has_text=re.compile(r"200 (length|stop)")
    )
    wait_until(lambda: served.count() >= 2, 10)  # the page's request and the replay, in the status view
    assert "tokens" in page.text_content(".msg.assistant .meta")
    stats = page_server.stats()
    assert int(str(stats["prefix_cache_bytes"])) > 0 and int(str(stats["prefix_cache_blocks"])) > 0
    held = page.locator("#prefix-extras dt", has_text="held").locator("xpath=following-sibling::dd[1]")
    wait_until(
        lambda: held.count() == 1 and "iB" in (held.text_content() or ""), 5
    )  # what it holds, in bytes
    check_screenshot(page, page.screenshot(path=str(tmp_path / "page.png")))


def check_screenshot(page: Any, png: bytes) -> None:
    """Not blank, and each key element lies in the viewport with something drawn in its box."""
    image = read_png(png)
    assert (image.width, image.height) == (VIEWPORT["width"], VIEWPORT["height"])
    colours = image.colours(0, 0, image.width, image.height)
    assert len(colours) > 100 and max(colours.values()) < 0.95 * sum(colours.values())
    for selector in KEY_ELEMENTS:
        box = page.locator(selector).bounding_box()
        assert box is not None and box["width"] > 20 and box["height"] > 10, selector
        left, top = int(box["x"]), int(box["y"])
        right, bottom = int(box["x"] + box["width"]), int(box["y"] + box["height"])
        assert 0 <= left and right <= image.width and 0 <= top and bottom <= image.height, (selector, box)
        assert len(image.colours(left, top, right, bottom, step=1)) > 3, f"{selector} is blank"


def test_page_stop_button_ends_the_generation(page_server: ServerProcess, page: Any) -> None:
    page.add_init_script(f"localStorage.setItem('mlx-serve.api-key', {json.dumps(KEY)})")
    page.goto(page_server.url + "/")
    page.locator("#model-state[data-state=ready]").wait_for(timeout=60_000)
    before = page_server.stats()
    page.fill("#temperature", "0")
    page.fill("#max-tokens", "2000")
    page.fill("#prompt", "Write a very long story about a lighthouse keeper.")
    page.click("#send")
    wait_until(lambda: len(page.text_content(".msg.assistant .content") or "") > 20)
    wait_until(lambda: page.text_content("#rows-running") == "1", 5)  # the status view sees it decode
    live = page.locator("#recent-rows tr", has_text="decoding")
    wait_until(lambda: live.count() == 1, 5)
    assert page.is_enabled("#stop") and page.is_disabled("#send")
    page.click("#stop")
    page.locator(".msg.assistant[data-done]").wait_for()
    assert "stopped" in page.text_content(".msg.assistant .meta")
    assert page.is_enabled("#send") and page.is_disabled("#stop")
    deadline = time.monotonic() + 10
    while page_server.stats()["requests_aborted"] == before["requests_aborted"]:
        assert time.monotonic() < deadline, "the engine never saw the stop"
        time.sleep(0.1)
    generated = int(str(page_server.stats()["generated_tokens"])) - int(str(before["generated_tokens"]))
    assert generated < 500  # far from the 2000 asked for
    wait_until(lambda: page.text_content("#rows-running") == "0" and live.count() == 0, 5)


@pytest.mark.parametrize("load_error", [None, "no weights in /models/missing"])
def test_page_follows_the_engine_from_loading_to_ready_or_failed(page: Any, load_error: str | None) -> None:
    """The page says `loading` while the model loads, then `ready` (or `failed`, with the load
    error on the badge), without a script error on the way."""
    gate = threading.Event()
    engine, _ = fake_engine(["a"], load_gate=gate, load_error=load_error)
    config = Config(model="fake-model")
    stack, _ = serving_stack(App(config, engine), config, Drain())
    with hypercorn_serving(stack, ready_path="/") as url:
        page.goto(url + "/")
        page.locator("#model-state[data-state=loading]").wait_for(timeout=10_000)
        gate.set()
        if load_error is None:
            page.locator("#model-state[data-state=ready]").wait_for(timeout=10_000)
            assert page.text_content("#model-name") == "fake-model"
            wait_until(lambda: page.text_content("#rows-running") == "0", 5)
        else:
            page.locator("#model-state[data-state=failed]").wait_for(timeout=10_000)
            wait_until(lambda: load_error in (page.get_attribute("#model-state", "title") or ""), 5)
