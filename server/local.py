"""Where the commands find a running server: $MLX_SERVE_URL (default http://127.0.0.1:8080) and
the key it may need in $MLX_SERVE_API_KEY (server.commands, server.launch)."""

from __future__ import annotations

import os

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "MLX_SERVE_URL"
KEY_ENV = "MLX_SERVE_API_KEY"


def server_url(rest: list[str]) -> str:
    """`--url URL` among `rest`, else the environment's, else the default."""
    if "--url" in rest and rest.index("--url") + 1 < len(rest):
        return rest[rest.index("--url") + 1].rstrip("/")
    return os.environ.get(URL_ENV, DEFAULT_URL).rstrip("/")


def auth_headers() -> dict[str, str]:
    key = os.environ.get(KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}
