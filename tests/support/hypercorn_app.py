"""An ASGI app behind a real Hypercorn on a free port, on a thread of the test process."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from tests.support.server_proc import free_port


@contextmanager
def hypercorn_serving(app: Any, ready_path: str = "/health", timeout_s: float = 30.0) -> Iterator[str]:
    """Serve `app` until the block ends; yields the base URL once `ready_path` answers 200."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{free_port()}"]
    config.accesslog = config.errorlog = None
    config.graceful_timeout = 0.5
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(serve(app, config, shutdown_trigger=stop.wait),), daemon=True
    )
    thread.start()
    url = f"http://{config.bind[0]}"
    try:
        _wait_ready(url + ready_path, timeout_s)
        yield url
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout_s)
        loop.close()


def _wait_ready(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready in {timeout_s}s")
