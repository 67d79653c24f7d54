"""Tier 3: what an operator sees when the server cannot start (one clear line, exit 1)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.server_proc import ROOT, ServerProcess, free_port


def run_server(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mlx_serve", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False)


def test_a_missing_model_folder_is_one_line_and_exit_1(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    done = run_server("--model", str(missing), "--port", str(free_port()))
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert errors and "cannot load the model" in errors[0] and str(missing) in done.stderr
    assert "Traceback" not in done.stderr


def test_a_port_in_use_is_one_line_and_exit_1(smollm_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_server("--model", str(smollm_path), "--port", str(port))
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr


def test_version_flag() -> None:
    done = run_server("--version", timeout_s=30)
    assert done.returncode == 0 and done.stdout.startswith("mlx-serve ")


FAKE_TORCH = """import os
with open(os.environ["FAKE_TORCH_MARK"], "a") as mark:
    mark.write(f"{os.getpid()}\\n")
__version__ = "2.9.0"
"""


def fake_torch(where: Path) -> dict[str, str]:
    """A torch "installed" under `where` that leaves a mark (its pid) once imported; the
    environment that puts it on the path."""
    (where / "site" / "torch").mkdir(parents=True)
    (where / "site" / "torch" / "__init__.py").write_text(FAKE_TORCH)
    return {"PYTHONPATH": str(where / "site"), "FAKE_TORCH_MARK": str(where / "imported")}


def test_neither_process_imports_an_installed_torch(smollm_path: Path, tmp_path: Path) -> None:
    """transformers imports torch whenever it is installed (10-12 s of an H200 host's start-up);
    mlx-serve never calls it, so neither the server process (the tokenizer) nor the engine process
    (mlx-lm, the model) imports it. MLX_SERVE_IMPORT_TORCH=1 lets it in."""
    env = fake_torch(tmp_path / "plain")
    python = [sys.executable, "-c"]
    subprocess.run([*python, "import mlx_lm"], cwd=ROOT, env={**os.environ, **env}, check=True)
    assert (tmp_path / "plain" / "imported").exists()  # mlx-lm alone imports it: the fake is found

    env = fake_torch(tmp_path / "served")
    server = ServerProcess(["--model", str(smollm_path)], tmp_path / "server.log", env=env)
    try:
        reply = httpx.post(
            server.url + "/v1/chat/completions",
            timeout=60,
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        )
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
        assert server.stats().get("engine_pid")  # the model ran in the engine process
    finally:
        server.close()
    assert not (tmp_path / "served" / "imported").exists()

    env = fake_torch(tmp_path / "allowed")
    subprocess.run(
        [*python, "import engine, mlx_lm"],
        cwd=ROOT,
        check=True,
        env={**os.environ, **env, "MLX_SERVE_IMPORT_TORCH": "1"},
    )
    assert (tmp_path / "allowed" / "imported").exists()
