from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.models import smollm_folder, tiny_llama
from tests.support.server_proc import ServerProcess


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    """SmolLM2-135M-Instruct converted by our GGUF loader (the default model), once into the user
    cache ($MLX_SERVE_CACHE or ~/.cache/mlx-serve) as the server does, reused by later runs: the
    servers the tests start keep their float32 copy of it there, keyed by its path."""
    from mlx_serve.engine.model.loader import cache_root

    return smollm_folder(cache_root())


@pytest.fixture(scope="session")
def tiny_path(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny") / "model", smollm_path)


@pytest.fixture(scope="session")
def smollm_server(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The real default model behind a real Hypercorn, started the way users start it."""
    log = tmp_path_factory.mktemp("logs") / "smollm-server.log"
    server = ServerProcess(["--model", str(smollm_path)], log)
    yield server
    server.close()


REAL_FIXTURES = frozenset({"smollm_path", "smollm_gguf", "gemma_gguf", "oracle"})
REAL_FOLDERS = ("tests/e2e/", "tests/deploy/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tier 3 (`-m real`): every test that loads a real model or starts a real server."""
    for item in items:
        path = item.nodeid.replace("\\", "/")
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & REAL_FIXTURES or path.startswith(REAL_FOLDERS):
            item.add_marker(pytest.mark.real)
