"""Tier 3: one server, several real models, through real Hypercorn and the real SDKs: two models
answer at once on OpenAI, Anthropic and Ollama routes; a crash in one model's engine leaves the
other answering throughout; load on demand under a small --memory-budget unloads the least
recently used model, --idle-unload-s frees an idle one, and the admin API loads it back with
its progress events."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import httpx
import numpy as np
import ollama
import openai
import orjson
import pytest

from tests import lora_fixture
from tests.support.server_proc import ServerProcess

pytestmark = pytest.mark.real

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a very long story about a dragon who learns to cook."}]
PARIS = "The capital of France is Paris."


@pytest.fixture(scope="module")
def two(
    smollm_path: Path, tiny_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """SmolLM2 (with a LoRA adapter, `smol:lighthouse`) from a models file, and a tiny model."""
    folder = tmp_path_factory.mktemp("two-models")
    models = folder / "models.toml"
    models.write_text(
        f'[[models]]\nname = "smol"\nsource = "{smollm_path}"\n'
        f'adapters = {{ lighthouse = "{lora_fixture.trained_adapter()}" }}\n'
    )
    args = ["--models", str(models), "--model", f"tiny={tiny_path}", "--model", "minilm=all-minilm-l6-v2"]
    server = ServerProcess(args, folder / "log", bare=True)
    yield server
    server.close()


def models(server: ServerProcess) -> dict[str, dict[str, object]]:
    data = httpx.get(server.url + "/models", timeout=10).json()["data"]
    return {m["id"]: m for m in data}


def ask(server: ServerProcess, model: str, max_tokens: int = 12) -> str:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    reply = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=max_tokens, temperature=0
    )  # type: ignore[arg-type]
    return reply.choices[0].message.content or ""


def test_two_models_answer_at_once_on_every_sdk(two: ServerProcess) -> None:
    with ThreadPoolExecutor(4) as pool:  # tiny loads on demand while smol answers
        smol, tiny = pool.submit(ask, two, "smol"), pool.submit(ask, two, "tiny")
        assert smol.result().startswith(PARIS)
        tiny_text = tiny.result()
    assert tiny_text and not tiny_text.startswith(PARIS)  # random weights: another model answered
    claude = anthropic.Anthropic(base_url=two.url, api_key="unused", max_retries=0)
    message = claude.messages.create(model="smol", max_tokens=12, messages=QUESTION)  # type: ignore[arg-type]
    assert message.content[0].text.startswith(PARIS) and message.model == "smol"  # type: ignore[union-attr]
    local = ollama.Client(host=two.url, timeout=300)
    chat = local.chat(model="tiny:latest", messages=QUESTION, options={"temperature": 0, "num_predict": 12})
    assert chat.message.content == tiny_text
    assert ask(two, "default").startswith(PARIS)  # no name: the first model
    with pytest.raises(
        openai.NotFoundError, match="use one of: smol, smol:lighthouse, tiny, minilm"
    ) as refused:
        ask(two, "gpt-4")
    assert refused.value.code == "model_not_found"
    listed = openai.OpenAI(base_url=two.url + "/v1", api_key="unused").models.list()
    states = {m.id: m.model_extra["state"] for m in listed.data}  # type: ignore[index]
    assert states == {"smol": "loaded", "smol:lighthouse": "unloaded", "tiny": "loaded", "minilm": "unloaded"}
    assert [m["name"] for m in local.ps().model_dump()["models"]] == ["smol:latest", "tiny:latest"]


def test_base_colon_adapter_serves_the_base_with_that_lora_adapter(two: ServerProcess) -> None:
    client = openai.OpenAI(base_url=two.url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def answer(model: str, question: str) -> str:
        messages = lora_fixture.chat(question)
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=16, temperature=0)  # type: ignore[arg-type]
        return reply.choices[0].message.content or ""

    assert answer("smol:lighthouse", lora_fixture.QUESTION).startswith(lora_fixture.PHRASE)
    assert not answer("smol", lora_fixture.QUESTION).startswith(lora_fixture.PHRASE)
    assert answer("smol:lighthouse", lora_fixture.CONTROL).startswith(PARIS)


def test_an_embedding_model_beside_the_chat_models(two: ServerProcess) -> None:
    client = openai.OpenAI(base_url=two.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    texts = ["A man is eating food.", "The new movie is awesome"]
    vectors = client.embeddings.create(model="minilm", input=texts)
    assert [len(d.embedding) for d in vectors.data] == [384, 384] and vectors.model == "minilm"
    ollama_vectors = ollama.Client(host=two.url).embed(model="minilm", input=texts).embeddings
    assert np.allclose(ollama_vectors, [d.embedding for d in vectors.data], atol=1e-5)
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        ask(two, "minilm")
    with pytest.raises(openai.BadRequestError, match="generates text"):
        client.embeddings.create(model="smol", input=texts)
    assert ask(two, "smol").startswith(PARIS)


def _stream(server: ServerProcess, model: str, out: list[str]) -> None:
    body = {"model": model, "messages": STORY, "max_tokens": 120, "stream": True, "temperature": 0}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=300) as r:
        out.extend(line for line in r.iter_lines() if line.startswith("data: "))


def test_a_crash_in_one_models_engine_leaves_the_other_answering(two: ServerProcess) -> None:
    ask(two, "tiny")  # loaded
    victim = int(models(two)["tiny"]["pid"])  # type: ignore[call-overload]
    lines: list[str] = []
    streaming = threading.Thread(target=_stream, args=(two, "smol", lines))
    streaming.start()
    deadline = time.monotonic() + 120
    while not any('"content":"' in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(victim, signal.SIGKILL)
    answers = [ask(two, "smol") for _ in range(2)]  # answered while tiny's engine is down
    streaming.join(300)
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines)
    assert all(a.startswith(PARIS) for a in answers)
    deadline = time.monotonic() + 120  # tiny's engine is restarted and answers again
    while models(two)["tiny"]["pid"] in (victim, None) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ask(two, "tiny")
    assert httpx.get(two.url + "/health", timeout=5).status_code == 200


def test_load_on_demand_least_recently_used_idle_unload_and_admin(smollm_path: Path, tmp_path: Path) -> None:
    # SmolLM2 twice, from two sources (its converted folder and its GGUF file): each needs about
    # 0.9 GiB served as float32, so 1.5 GiB holds one of them at a time.
    from mlx_serve.engine.model.loader import default_gguf

    args = ["--model", f"smol={smollm_path}", "--model", f"smol2={default_gguf()}", "--memory-budget", "1.5G"]
    server = ServerProcess([*args, "--idle-unload-s", "4"], tmp_path / "server.log", bare=True)
    try:
        assert ask(server, "smol").startswith(PARIS)  # the first model, loaded at start
        assert ask(server, "smol2").startswith(PARIS)  # loaded on demand, smol unloaded for it
        states = {k: v["status"]["value"] for k, v in models(server).items()}  # type: ignore[index]
        assert states == {"smol": "unloaded", "smol2": "loaded"}
        events: list[dict[str, object]] = []
        watcher = threading.Thread(target=_events, args=(server, events), daemon=True)
        watcher.start()
        time.sleep(6)  # past --idle-unload-s: smol2 is freed
        assert models(server)["smol2"]["status"] == {"value": "unloaded", "error": None}
        loaded = httpx.post(server.url + "/models/load", json={"model": "smol"}, timeout=10)
        assert loaded.status_code == 200 and loaded.json()["success"] is True
        watcher.join(180)
        assert [(e["model"], e["status"]) for e in events if e["status"] != "unloaded"][-2:] == [
            ("smol", "loading"), ("smol", "ready"),
        ]  # fmt: skip
        assert ask(server, "smol").startswith(PARIS)
    finally:
        server.close()


def _events(server: ServerProcess, out: list[dict[str, object]]) -> None:
    with httpx.stream("GET", server.url + "/models/sse", timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                out.append(orjson.loads(line[6:]))
                if out[-1]["status"] == "ready":
                    return
