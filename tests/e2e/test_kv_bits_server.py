"""Tier 3: `--kv-bits 8` behind a real server, through the real openai SDK on SmolLM2.

The flag reaches the engine process: greedy text equals mlx-lm's stream_generate on its
QuantizedKVCache at 8 bits (quantized_kv_start=0) on the same prompt, the memory plan states the
quantized bytes per token, and the prefix cache says it is off.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.server_proc import ServerProcess

ASK = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def server(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "kv-bits-server.log"
    proc = ServerProcess(["--model", str(smollm_path), "--kv-bits", "8"], log)
    yield proc
    proc.close()


def quantized_reference(smollm_path: Path, max_tokens: int) -> str:
    from mlx_lm import load, stream_generate
    from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache

    from mlx_serve.engine.model.loader import maybe_dequantize

    model, tokenizer = load(str(smollm_path))
    model = maybe_dequantize(model)  # the weights the server runs (float32 on a CPU)
    ids = tokenizer.apply_chat_template(ASK, add_generation_prompt=True)
    cache = [QuantizedKVCache(group_size=64, bits=8) for _ in make_prompt_cache(model)]
    text = ""
    for resp in stream_generate(
        model, tokenizer, ids, max_tokens=max_tokens, prompt_cache=cache, kv_bits=8, quantized_kv_start=0
    ):
        text += resp.text
    return text


def test_kv_bits_8_serves_mlx_lm_quantized_greedy_text(server: ServerProcess, smollm_path: Path) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model="default", messages=ASK, max_tokens=24, temperature=0)
    assert r.choices[0].message.content == quantized_reference(smollm_path, 24)
    log = server.log()
    assert "prompt cache: off with --kv-bits" in log
    assert "KV 12.7 KiB/token" in log  # 46,080 bytes of float32 KV a token at 8 bits: 12,960
