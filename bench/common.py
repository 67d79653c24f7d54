"""What every benchmark shares: its flags, the model it runs, the servers it starts, the BLAS."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import statistics
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from bench.servers import (
    SERVER_NAMES,
    RunningServer,
    ServerSpec,
    server_cwd,
    start_server,
    stop_server,
    wait_healthy,
    wait_warmed,
)

BLAS_MARK = "MLX_SERVE_BLAS_CHOSEN"
# What the clients send as "model": each server answers it with the model it was started with.
REQUEST_MODEL = "default_model"


def add_common(
    p: argparse.ArgumentParser, rounds: int = 3, clients: str = "1", max_tokens: int = 128
) -> None:
    """The flags every benchmark takes."""
    p.add_argument(
        "--model",
        default=None,
        help="model folder, .gguf file, or a shortcut the server accepts (default: SmolLM2-135M)",
    )
    p.add_argument("--rounds", type=int, default=rounds, help="rounds; medians are reported")
    p.add_argument("--clients", default=clients, help="comma-separated client counts")
    p.add_argument("--max-tokens", type=int, default=max_tokens, help="tokens generated per request")
    p.add_argument("--servers", default=",".join(SERVER_NAMES), help="which servers to run")
    p.add_argument("--mlx-serve-args", default="", help="extra mlx-serve flags, one string")
    p.add_argument("--mlx-lm-args", default="", help="extra mlx_lm.server flags, one string")
    p.add_argument("--bundled-blas", action="store_true", help="Linux CPU: keep MLX's bundled BLAS")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--log-dir", type=Path, default=None, help="server logs (default: a new temp folder)")
    p.add_argument("--json", type=Path, default=None, help="save the raw numbers here")


def reexec_with_openblas(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """On a Linux CPU, run the whole bench (and so every process it starts) on OpenBLAS, as
    mlx-serve chooses for itself: every contestant then runs on the same BLAS."""
    from mlx_serve.engine.model.blas import find_openblas

    if args.bundled_blas or os.environ.get(BLAS_MARK) or "mlx.core" in sys.modules:
        return
    lib = find_openblas() if sys.platform.startswith("linux") else None
    if lib is None or lib in os.environ.get("LD_PRELOAD", ""):
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
    env[BLAS_MARK] = "1"
    os.execve(sys.executable, [sys.executable, "-m", "bench", *argv], env)


def model_folder(spec: str | None) -> Path:
    """The mlx-lm folder every contestant loads for `--model SPEC`. A quantized model that
    mlx-serve would serve as float32 (a CPU) is given to all of them as its float32 copy, so
    that all run the same weights."""
    import mlx.core as mx

    from mlx_serve.engine.model import dequantized, loader

    path, _ = loader.resolve(spec)
    if mx.default_device() != mx.cpu or "quantization" not in (path / "config.json").read_text():
        return path
    copy = dequantized.copy_folder(path, loader.cache_root())
    if not copy.is_dir():
        loader.load_model(loader.prepare(str(path)))  # writes the copy
    return copy if copy.is_dir() else path


def server_names(args: argparse.Namespace) -> list[str]:
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    unknown = [n for n in names if n not in SERVER_NAMES]
    if unknown:
        raise SystemExit(f"--servers: unknown {unknown}; choose from {SERVER_NAMES}")
    return names


def clients(args: argparse.Namespace) -> list[int]:
    return list(dict.fromkeys(int(c) for c in args.clients.split(",") if c.strip()))


def log_dir(args: argparse.Namespace, tag: str) -> Path:
    folder: Path = args.log_dir or Path(tempfile.mkdtemp(prefix=f"bench-{tag}-"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def server_spec(args: argparse.Namespace, name: str, model: Path, logs: Path, extra: str = "") -> ServerSpec:
    flags = args.mlx_serve_args if name == "mlx-serve" else args.mlx_lm_args
    return ServerSpec(
        name, model, shlex.split(flags) + shlex.split(extra), dict(os.environ), server_cwd(name, logs)
    )


@contextlib.asynccontextmanager
async def serving(spec: ServerSpec, log_path: Path, timeout_s: float) -> AsyncIterator[RunningServer]:
    """One server, healthy and past its idle warm-up; stopped on exit."""
    server = start_server(spec, log_path)
    try:
        await wait_healthy(server, timeout_s)
        await wait_warmed(server, timeout_s)
        yield server
    finally:
        stop_server(server)


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def load_as_served(path: Path) -> tuple[Any, Any]:
    """Model and tokenizer as the server runs them: its attention choice on MLX's CUDA backend
    (engine.model.backend) and its weight dtype (engine.model.loader.maybe_dequantize)."""
    from mlx_lm import load

    from mlx_serve.engine.model.backend import prefer_shape_free_attention
    from mlx_serve.engine.model.loader import maybe_dequantize

    prefer_shape_free_attention()
    model, tokenizer = load(str(path))[:2]
    return maybe_dequantize(model), tokenizer
