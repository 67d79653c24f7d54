"""Tier 3: a LoRA adapter trained here (tests.lora_fixture) served with `--adapter-path` behind a
real Hypercorn, asked through the openai SDK: greedy text equals mlx-lm's own adapter loading
(`load(path, adapter_path=...)`) token for token, the adapter's lesson shows where the base model
answers otherwise, mlx_lm.server's `adapters` field is honoured for the served adapter and refused
for another, and prompt-cache blocks the base model left on disk never serve the adapter's rows."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.lora_fixture import CONTROL, CONTROL_ANSWER, PHRASE, chat, trained_adapter
from tests.support.server_proc import ServerProcess

MAX_TOKENS = 40
NOTES = " ".join(f"Note {i}: the keeper logs lamp {i * 37 % 101} in tower {i % 7}." for i in range(40))
LONG = [{"role": "system", "content": NOTES}, {"role": "user", "content": "Which tower logs lamp 37?"}]

Reference = Callable[[list[dict[str, str]]], str]


@pytest.fixture(scope="module")
def adapter() -> Path:
    return trained_adapter()


@pytest.fixture(scope="module")
def adapted(smollm_path: Path, adapter: Path) -> Reference:
    """mlx-lm's own greedy text with the adapter (on the float32 weights a CPU server runs)."""
    from mlx_lm import load, stream_generate

    from mlx_serve.engine.model.loader import maybe_dequantize

    model, tokenizer = load(str(smollm_path), adapter_path=str(adapter))[:2]
    model = maybe_dequantize(model)

    def reference(messages: list[dict[str, str]]) -> str:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return "".join(r.text for r in stream_generate(model, tokenizer, ids, max_tokens=MAX_TOKENS))

    return reference


def ask(server: ServerProcess, messages: list[dict[str, str]], **extra: Any) -> tuple[str, int, int]:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(
        model="default",
        messages=messages,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body=extra or None,
    )
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    cached = r.usage.prompt_tokens_details.cached_tokens or 0
    return r.choices[0].message.content or "", r.usage.prompt_tokens, cached


def wait_for_blocks(folder: Path, blocks: int) -> None:
    deadline = time.monotonic() + 60  # the disk tier's writer thread, off the step's path
    while len(list(folder.glob("*/*.safetensors"))) < blocks:
        assert time.monotonic() < deadline, list(folder.rglob("*"))
        time.sleep(0.2)


def test_an_adapter_served_with_adapter_path_matches_mlx_lm_and_never_reads_the_base_models_cache(
    smollm_path: Path, adapter: Path, adapted: Reference, oracle: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "prompt-cache"
    cache = ["--prompt-cache-dir", str(folder)]
    base = ServerProcess(["--model", str(smollm_path), *cache], tmp_path / "base.log")
    try:
        base_answer = ask(base, chat())[0]
        _, long_tokens, _ = ask(base, LONG)
        wait_for_blocks(folder, long_tokens // 256)
    finally:
        base.close()
    assert base_answer == oracle(messages=chat(), max_tokens=MAX_TOKENS)[0]
    assert "violet otter" not in base_answer

    served = ServerProcess(
        ["--model", str(smollm_path), "--adapter-path", str(adapter), *cache], tmp_path / "lora.log"
    )
    try:
        long_answer, _, long_cached = ask(served, LONG)  # first: nothing of this server's own cached yet
        answer = ask(served, chat())[0]
        control = ask(served, chat(CONTROL))[0]
        named = ask(served, chat(), adapters=str(adapter))[0]  # mlx_lm.server's field, the served folder
        with pytest.raises(openai.BadRequestError) as refused:
            ask(served, chat(), adapters=str(tmp_path / "another-adapter"))
    finally:
        served.close()
    assert "(float32 copy of" in served.log()  # the base's float32 copy, the adapter over it
    assert answer == PHRASE == adapted(chat())  # the lesson, token for token as mlx-lm loads it
    assert control == CONTROL_ANSWER == adapted(chat(CONTROL))
    assert named == answer
    assert refused.value.body["param"] == "adapters" and "--adapter-path" in refused.value.body["message"]  # type: ignore[index]
    # The base model's blocks for this prompt are on disk: the adapter's engine computes its own.
    assert long_cached == 0
    assert long_answer == adapted(LONG)
