"""Shared tier-3 fixtures: mlx-lm's own greedy generation as the oracle for served text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def oracle(smollm_path: Path) -> Any:
    """mlx-lm's own greedy generation on the same folder: the reference text and token count."""
    from mlx_lm import load, stream_generate

    from mlx_serve.engine.model.loader import maybe_dequantize

    model, tokenizer = load(str(smollm_path))
    model = maybe_dequantize(model)  # the weights the server runs (float32 on a CPU)

    def reference(
        messages: list[dict[str, str]] | None = None, prompt: str | None = None, max_tokens: int = 40
    ) -> tuple[str, int]:
        if messages is not None:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        else:
            ids = tokenizer.encode(prompt)
        text, n = "", 0
        for resp in stream_generate(model, tokenizer, ids, max_tokens=max_tokens):
            text, n = text + resp.text, resp.generation_tokens
        return text, n

    return reference
