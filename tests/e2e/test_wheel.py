"""Tier 3: what `pip install mlx-serving` puts in site-packages — one package, mlx_serve, with the
page's files and both commands — and that the installed copy runs outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.server_proc import ROOT

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    (found,) = out.glob("mlx_serving-*.whl")
    return found


def test_the_wheel_installs_one_namespace_with_the_page_and_both_commands(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"mlx_serve", wheel.name.split("-py3")[0] + ".dist-info"}
    for pkg in ("server", "protocols", "engine"):
        assert f"mlx_serve/{pkg}/__init__.py" in names
    assert "mlx_serve/server/static/index.html" in names
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry).decode()
    assert "mlx-serve = mlx_serve.server.cli:main" in scripts
    assert "mlx-serving = mlx_serve.server.cli:main" in scripts


def test_the_installed_package_runs_outside_the_checkout(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = subprocess.run(
        [sys.executable, "-c", "import mlx_serve.server.cli as c; print(c.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(target)
    helped = subprocess.run(
        [sys.executable, "-m", "mlx_serve", "--help"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert helped.returncode == 0, helped.stderr
    assert "--model" in helped.stdout and "usage:" in helped.stdout
