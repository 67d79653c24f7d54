"""Which BLAS MLX's CPU backend runs on, and choosing OpenBLAS on Linux when it is there.

The `mlx[cpu]` wheel bundles the reference BLAS, which makes prefill 10-25x slower than
OpenBLAS. The library must be preloaded before MLX loads, so the choice is made by
re-executing the process once with LD_PRELOAD set, or, where only the processes it starts compute
(a server whose engines are child processes), by setting it for them alone: the server's own
re-execution cost a second interpreter start and its imports before the engine could start.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

OPENBLAS_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
REEXEC_MARK = "MLX_SERVE_BLAS_CHOSEN"


def find_openblas() -> str | None:
    return next((p for p in OPENBLAS_CANDIDATES if Path(p).exists()), None)


def wanted_preload(choice: str) -> str | None:
    """The library to preload for `--blas CHOICE`, or None to keep what we have."""
    if not sys.platform.startswith("linux") or choice == "bundled":
        return None
    lib = find_openblas() if choice == "auto" else choice
    if lib is None or lib in os.environ.get("LD_PRELOAD", ""):
        return None
    return lib


def reexec_with_blas(choice: str) -> None:
    """Replace this process with one that preloads the chosen BLAS (at most once)."""
    if os.environ.get(REEXEC_MARK) or "mlx.core" in sys.modules:
        return
    lib = wanted_preload(choice)
    if lib is None:
        return
    if not Path(lib).exists():
        raise SystemExit(f"--blas {lib}: no such file")
    env = dict(os.environ)
    env["LD_PRELOAD"] = ":".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
    env[REEXEC_MARK] = "1"
    os.execve(sys.executable, [sys.executable, "-m", "mlx_serve", *sys.argv[1:]], env)


def preload_for_children(choice: str) -> None:
    """The chosen BLAS for the processes this one starts from now on (not for itself)."""
    if os.environ.get(REEXEC_MARK):
        return
    lib = wanted_preload(choice)
    if lib is None:
        return
    if not Path(lib).exists():
        raise SystemExit(f"--blas {lib}: no such file")
    os.environ["LD_PRELOAD"] = ":".join(p for p in (lib, os.environ.get("LD_PRELOAD", "")) if p)
    os.environ[REEXEC_MARK] = "1"


def blas_in_use() -> str:
    """Read the loaded libraries to say which BLAS this process really runs on."""
    if sys.platform == "darwin":
        return "Accelerate"
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "unknown"
    if "libopenblas" in maps:
        return "OpenBLAS (" + next(t for t in maps.split() if "libopenblas" in t) + ")"
    return "bundled reference BLAS (slow prefill: apt-get install libopenblas0-pthread)"
