"""Choosing the BLAS for the engine processes a server starts, without re-executing the server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mlx_serve.engine.model.blas import REEXEC_MARK, preload_for_children


def test_a_server_whose_engines_are_children_sets_the_blas_for_them_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lib = tmp_path / "libblas-stand-in.so"
    lib.write_bytes(b"")
    monkeypatch.delenv(REEXEC_MARK, raising=False)
    monkeypatch.setenv("LD_PRELOAD", "")
    linux = sys.platform.startswith("linux")
    preload_for_children(str(lib))  # this process goes on as it is: no re-exec
    if linux:  # the processes it starts from now on preload it
        assert os.environ["LD_PRELOAD"] == str(lib) and os.environ[REEXEC_MARK] == "1"
        assert lib.name not in Path("/proc/self/maps").read_text()
    else:  # Accelerate on macOS: nothing to preload
        assert os.environ["LD_PRELOAD"] == "" and REEXEC_MARK not in os.environ
    preload_for_children(str(tmp_path / "another.so"))  # once chosen, kept
    assert os.environ["LD_PRELOAD"] == (str(lib) if linux else "")
