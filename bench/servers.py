"""Start a server under test as a subprocess on a free port, wait for /health, stop it.

Servers are started with `sys.executable -m ...` (no console scripts, so the same command works
on a host with dependencies on PYTHONPATH) in their own session, so stopping one ends the
process group it started (an engine child included) and nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parent.parent
HEALTH_POLL_S = 0.5
STOP_GRACE_S = 15.0
SERVER_NAMES = ("mlx-serve", "mlx_lm")


class ServerStartError(RuntimeError):
    """The server exited, or did not answer /health with 200, before the startup timeout."""


@dataclass(frozen=True, slots=True)
class ServerSpec:
    name: str
    model_dir: Path
    extra_args: list[str]
    env: dict[str, str]
    cwd: Path


@dataclass(slots=True)
class RunningServer:
    spec: ServerSpec
    argv: list[str]
    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path
    startup_s: float = 0.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_argv(name: str, model_dir: Path, port: int, extra: list[str]) -> list[str]:
    common = ["--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    if name == "mlx-serve":
        return [sys.executable, "-m", "mlx_serve", *common, *extra]
    if name == "mlx_lm":
        return [sys.executable, "-m", "mlx_lm", "server", *common, *extra]
    raise ValueError(f"unknown server {name!r}; choose from {SERVER_NAMES}")


def server_cwd(name: str, log_dir: Path) -> Path:
    # mlx-serve runs from the repo root (`python -m mlx_serve`); mlx_lm from a neutral folder so the
    # repo's top-level packages cannot shadow anything it imports.
    return REPO_ROOT if name == "mlx-serve" else log_dir


def start_server(spec: ServerSpec, log_path: Path) -> RunningServer:
    """Launch on a free port with stdout and stderr going to `log_path`."""
    port = free_port()
    argv = server_argv(spec.name, spec.model_dir, port, spec.extra_args)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, cwd=spec.cwd, env=spec.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    return RunningServer(spec, argv, process, f"http://127.0.0.1:{port}", log_path)


async def wait_healthy(server: RunningServer, timeout_s: float) -> None:
    """Poll /health until 200; raise ServerStartError if the process dies or time runs out."""
    start = time.perf_counter()
    async with httpx.AsyncClient(timeout=5.0) as client:
        while time.perf_counter() - start < timeout_s:
            if server.process.poll() is not None:
                raise ServerStartError(
                    f"exited with code {server.process.returncode}: {log_tail(server.log_path)}"
                )
            try:
                if (await client.get(server.base_url + "/health")).status_code == 200:
                    server.startup_s = time.perf_counter() - start
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(HEALTH_POLL_S)
    raise ServerStartError(f"no /health 200 after {timeout_s:.0f} s: {log_tail(server.log_path)}")


async def wait_warmed(server: RunningServer, timeout_s: float) -> float:
    """Once healthy, wait for mlx-serve's idle warm-up (engine.host.warmup: the larger bursts, run
    while no request is in) to finish, by its log; seconds waited (0.0 when it has none). A
    single-stream bench must: each request would restart the burst under way, so the bursts
    would run on the same GPU through every other context's measurement."""
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        log = server.log_path.read_text(errors="replace")
        if " rows while idle" not in log or "warm-up while idle:" in log:
            return time.perf_counter() - start
        await asyncio.sleep(0.5)
    raise ServerStartError(f"idle warm-up not done after {timeout_s:.0f} s: {log_tail(server.log_path)}")


def stop_server(server: RunningServer) -> None:
    """SIGTERM the server's process group, SIGKILL it after a grace period."""
    if server.process.poll() is None:
        _signal_group(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(server.process.pid, signal.SIGKILL)
            server.process.wait()
    # children that outlived the leader still carry its process group id
    _signal_group(server.process.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def log_tail(path: Path, num_lines: int = 12) -> str:
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return " | ".join(lines[-num_lines:]) or "(empty log)"


def blas_banner(path: Path) -> list[str]:
    """Lines of the server's log that name its BLAS (mlx-serve prints `BLAS: ...` at startup)."""
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return [line.strip() for line in lines if "BLAS:" in line][:5]


def loaded_blas_libs(pid: int) -> list[str]:
    """BLAS/LAPACK libraries MLX may use, mapped into `pid` or its descendants (Linux /proc; else [])."""
    found: set[str] = set()
    for proc in descendants(pid):
        try:
            maps = Path(f"/proc/{proc}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            path = line.split()[-1] if line.split() else ""
            name = os.path.basename(path).lower()
            # numpy's bundled scipy_openblas is mapped by any process importing numpy; MLX never uses it
            if "numpy.libs" in path or "scipy_openblas" in name:
                continue
            if path.startswith("/") and any(k in name for k in ("blas", "lapack", "mkl", "accelerate")):
                found.add(path)
    return sorted(found)


def descendants(pid: int) -> list[int]:
    pids, queue = [], [pid]
    while queue:
        current = queue.pop()
        pids.append(current)
        for children in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                queue += [int(c) for c in children.read_text().split()]
            except OSError:
                continue
    return pids


def bench_parser(doc: str) -> argparse.ArgumentParser:
    """The flags every single-server bench takes: the model, and extra mlx-serve flags."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--mlx-serve-args", default="", help="extra mlx-serve flags, space-separated")
    return parser


@contextlib.asynccontextmanager
async def mlx_serve_running(args: argparse.Namespace, tag: str, timeout_s: float = 900) -> AsyncIterator[str]:
    """mlx-serve on args.model (plus args.mlx_serve_args), healthy; yields its base URL."""
    log_dir = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
    spec = ServerSpec(
        "mlx-serve",
        Path(args.model),
        args.mlx_serve_args.split(),
        dict(os.environ),
        server_cwd("mlx-serve", log_dir),
    )
    server = start_server(spec, log_dir / "mlx-serve.log")
    try:
        await wait_healthy(server, timeout_s)
        yield server.base_url
    finally:
        stop_server(server)
