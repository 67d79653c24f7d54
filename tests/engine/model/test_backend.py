"""engine.model.backend: the server turns MLX's cuDNN attention off unless the environment chose."""

from __future__ import annotations

import os

import pytest

from mlx_serve.engine.model.backend import CUDNN_ATTENTION, prefer_shape_free_attention


def test_cudnn_attention_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CUDNN_ATTENTION, raising=False)
    prefer_shape_free_attention()
    assert os.environ[CUDNN_ATTENTION] == "0"


def test_a_users_choice_of_cudnn_attention_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CUDNN_ATTENTION, "1")
    prefer_shape_free_attention()
    assert os.environ[CUDNN_ATTENTION] == "1"
