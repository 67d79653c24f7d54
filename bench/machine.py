"""The machine a benchmark ran on, in one line: CPU, cores, memory, GPU, MLX and its BLAS."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Machine:
    cpu: str
    cores: int
    memory_gib: float
    gpu: str
    mlx: str
    mlx_lm: str
    device: str
    blas: str
    load_average: float

    def line(self) -> str:
        return (
            f"machine: {self.cpu}, {self.cores} cores, {self.memory_gib:.0f} GiB; GPU {self.gpu}; "
            f"mlx {self.mlx} on {self.device}, mlx-lm {self.mlx_lm}; BLAS {self.blas}; "
            f"load average {self.load_average:.2f}"
        )


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        return _command(["sysctl", "-n", "machdep.cpu.brand_string"]) or platform.machine()
    return platform.processor() or platform.machine()


def gpu_name() -> str:
    names = _command(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]).splitlines()
    if names:
        return f"{len(names)}x {names[0].strip()}"
    return "Apple silicon (Metal)" if platform.system() == "Darwin" else "none"


def memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


def blas() -> str:
    """The BLAS this process's MLX runs on (the bench starts every contestant with the same)."""
    from mlx_serve.engine.model.blas import blas_in_use

    return blas_in_use() if platform.system() != "Darwin" else "Accelerate"


def describe() -> Machine:
    import mlx.core as mx

    return Machine(
        cpu=cpu_name(),
        cores=os.cpu_count() or 0,
        memory_gib=memory_gib(),
        gpu=gpu_name(),
        mlx=_version("mlx"),
        mlx_lm=_version("mlx-lm"),
        device=str(mx.default_device()),
        blas=blas(),
        load_average=os.getloadavg()[0],
    )


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "?"


def _command(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""
