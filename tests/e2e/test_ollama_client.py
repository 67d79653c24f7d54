"""Tier 3: the official `ollama` Python client against a real Hypercorn: SmolLM2 for chat,
generate, structured output and the model facts (greedy answers equal the OpenAI routes'), and
Qwen2.5-Coder-0.5B for tool calls, streamed and not."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import ollama
import openai
import pytest

from tests.support.models import qwen_folder, r1_tiny
from tests.support.server_proc import ServerProcess, assert_disconnect_stops_generation

pytestmark = pytest.mark.real

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a very long story about a dragon who learns to cook."}]
GREEDY = {"temperature": 0, "num_predict": 32}


@pytest.fixture(scope="module")
def client(smollm_server: ServerProcess) -> ollama.Client:
    return ollama.Client(host=smollm_server.url, timeout=300)


@pytest.fixture(scope="module")
def oa(smollm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0)


def test_chat_greedy_equals_the_openai_route(client: ollama.Client, oa: openai.OpenAI) -> None:
    for messages in (QUESTION, STORY):
        r = client.chat(model="m", messages=messages, options=GREEDY, stream=False)
        want = oa.chat.completions.create(model="m", messages=messages, max_tokens=32, temperature=0)  # type: ignore[arg-type]
        assert r.message.role == "assistant" and r.message.content == want.choices[0].message.content
        assert want.usage is not None and r.done and r.model == "m"
        assert (r.prompt_eval_count, r.eval_count) == (want.usage.prompt_tokens, want.usage.completion_tokens)
        assert r.total_duration and r.eval_duration and r.total_duration >= r.eval_duration
    assert "Paris" in (client.chat(model="m:latest", messages=QUESTION, options=GREEDY).message.content or "")


def test_chat_streams_by_default_and_equals_the_whole_answer(client: ollama.Client) -> None:
    whole = client.chat(model="m", messages=STORY, options=GREEDY, stream=False)
    parts = list(client.chat(model="m", messages=STORY, options=GREEDY, stream=True))
    assert len(parts) > 3 and all(not p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    last = parts[-1]
    assert last.done and last.done_reason == "length" == whole.done_reason and last.eval_count == 32


def test_stream_is_ndjson_by_default(smollm_server: ServerProcess) -> None:
    body = {"model": "m", "messages": QUESTION, "options": GREEDY}
    with httpx.stream("POST", smollm_server.url + "/api/chat", json=body, timeout=300) as r:
        assert r.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[-1]["done"] is True and all(line["done"] is False for line in lines[:-1])


def test_disconnect_mid_stream_stops_generation(smollm_server: ServerProcess) -> None:
    body = {"model": "m", "messages": STORY, "options": {"num_predict": 2000}}
    assert_disconnect_stops_generation(smollm_server, "/api/chat", body, 6)


def test_generate_equals_chat_and_raw_equals_completions(client: ollama.Client, oa: openai.OpenAI) -> None:
    prompt = QUESTION[0]["content"]
    chat = client.chat(model="m", messages=QUESTION, options=GREEDY)
    gen = client.generate(model="m", prompt=prompt, options=GREEDY)
    assert gen.response == chat.message.content and gen.prompt_eval_count == chat.prompt_eval_count
    raw_prompt = "The three primary colors are"
    raw = "".join(p.response or "" for p in client.generate(model="m", prompt=raw_prompt, raw=True,
                                                           options={"temperature": 0, "num_predict": 24}, stream=True))  # fmt: skip
    want = oa.completions.create(model="m", prompt=raw_prompt, max_tokens=24, temperature=0)
    assert raw == want.choices[0].text


def test_empty_prompt_loads_the_model(client: ollama.Client) -> None:
    r = client.generate(model="m")
    assert r.done and r.done_reason == "load" and r.response == ""


def test_format_schema_is_enforced(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}  # fmt: skip
    r = client.chat(
        model="m", messages=QUESTION, format=schema, options={"temperature": 0, "num_predict": 60}
    )
    answer = json.loads(r.message.content or "")
    assert set(answer) == {"city", "country"} and all(isinstance(v, str) for v in answer.values())
    as_json = client.generate(model="m", prompt="Name a colour.", format="json", options={"num_predict": 40})
    assert isinstance(json.loads(as_json.response or ""), dict)


def test_tags_show_ps_and_version(
    client: ollama.Client, smollm_server: ServerProcess, smollm_path: Path
) -> None:
    names = [m.model for m in client.list().models]
    assert "m:latest" in names and names[0].endswith(":latest")
    shown = client.show("m")
    assert shown.capabilities and "completion" in shown.capabilities
    assert shown.template and "<|im_start|>" in shown.template
    assert shown.modelinfo and shown.modelinfo["mlx.context_length"] == 8192
    (loaded,) = client.ps().models
    assert loaded.context_length == 8192
    # The numbers clients show: the files on disk, Ollama's own spelling of SmolLM2's 134,515,008
    # parameters, its 4-bit MLX weights; in memory (this CPU serves float32) the weights and one
    # 8,192-token context of float32 KV (30 layers × 3 KV heads × 64 dims × K and V), none of
    # it a GPU's.
    (listed,) = [m for m in client.list().models if m.model == "m:latest"]
    assert listed.size == sum(f.stat().st_size for f in smollm_path.glob("*.safetensors"))
    assert shown.details.parameter_size == listed.details.parameter_size == "134.52M"
    assert shown.details.quantization_level == listed.details.quantization_level == "Q4"
    assert loaded.size == 134_515_008 * 4 + 8192 * (30 * 3 * 64 * 2 * 4) and loaded.size_vram == 0
    assert httpx.get(smollm_server.url + "/api/version").json()["version"]
    metrics = httpx.get(smollm_server.url + "/metrics").text  # one series per route, as the table names it
    assert 'endpoint="/api/tags",method="GET",status="200"' in metrics
    assert 'endpoint="/api/show",method="POST",status="200"' in metrics
    with pytest.raises(ollama.ResponseError) as e:
        client.show("no-such-model")
    assert e.value.status_code == 404


def test_errors_are_ollama_shaped(client: ollama.Client, smollm_server: ServerProcess) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="no-such-model", messages=QUESTION)
    assert e.value.status_code == 404 and "no-such-model" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="m", messages=QUESTION, options={"top_p": 3})
    assert e.value.status_code == 400 and "options.top_p" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="m", input="x")
    assert e.value.status_code == 400 and "no embeddings" in e.value.error


def test_ignored_options_and_keep_alive_are_named_in_warnings(smollm_server: ServerProcess) -> None:
    body = {"model": "m", "messages": QUESTION, "stream": False, "keep_alive": "10m",
            "options": {"num_predict": 4, "num_gpu": 99, "mirostat": 1}}  # fmt: skip
    r = httpx.post(smollm_server.url + "/api/chat", json=body, timeout=300)
    warnings = r.headers.get_list("warning")
    assert r.status_code == 200 and any("num_gpu" in w and "mirostat" in w for w in warnings)
    assert any("keep_alive" in w for w in warnings)


# --- tools, on a real tool-calling model --------------------------------------------------------

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                       "required": ["city"]},
    },
}  # fmt: skip
ASKED = [{"role": "user", "content": "What's the weather in Paris?"}]


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ollama.Client]:
    qwen_folder("qwen2.5-coder-0.5b")
    log: Path = tmp_path_factory.mktemp("logs") / "qwen-ollama.log"
    proc = ServerProcess(["--model", "qwen2.5-coder-0.5b"], log)
    yield ollama.Client(host=proc.url, timeout=300)
    proc.close()


def test_tool_calls_whole_and_streamed(qwen: ollama.Client) -> None:
    options = {"temperature": 0, "num_predict": 48}
    r = qwen.chat(model="m", messages=ASKED, tools=[WEATHER], options=options)
    streamed = list(qwen.chat(model="m", messages=ASKED, tools=[WEATHER], options=options, stream=True))
    calls = [r.message.tool_calls or [], [c for p in streamed for c in p.message.tool_calls or []]]
    assert [[(c.function.name, dict(c.function.arguments)) for c in cs] for cs in calls] == [
        [("get_weather", {"city": "Paris"})],
        [("get_weather", {"city": "Paris"})],
    ]
    assert r.done_reason == streamed[-1].done_reason == "stop"


def test_tool_round_trip_answers_from_the_result(qwen: ollama.Client) -> None:
    first = qwen.chat(
        model="m", messages=ASKED, tools=[WEATHER], options={"temperature": 0, "num_predict": 48}
    )
    (call,) = first.message.tool_calls or []
    earlier = [
        *ASKED,
        first.message,
        {"role": "tool", "content": "Light rain, 17 °C", "tool_name": call.function.name},
    ]
    again = [*earlier, {"role": "assistant", "content": "It is raining lightly in Paris, 17 °C."},
             {"role": "user", "content": "So how warm is it there, in degrees?"}]  # fmt: skip
    r = qwen.chat(model="m", messages=again, tools=[WEATHER], options={"temperature": 0, "num_predict": 48})
    assert "17" in (r.message.content or "")


# --- embeddings, on a real embedding model -------------------------------------------------------


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log: Path = tmp_path_factory.mktemp("logs") / "minilm-ollama.log"
    proc = ServerProcess(["--model", "all-minilm-l6-v2"], log, bare=True)
    yield proc
    proc.close()


def test_embed_equals_the_openai_route(minilm: ServerProcess) -> None:
    client = ollama.Client(host=minilm.url, timeout=120)
    name = client.list().models[0].model
    assert name and name.endswith(":latest")
    texts = ["A man is eating food.", "A man is eating a piece of bread."]
    r = client.embed(model=name, input=texts)
    want = openai.OpenAI(base_url=minilm.url + "/v1", api_key="unused").embeddings.create(
        model=name.removesuffix(":latest"), input=texts, encoding_format="float"
    )
    shown = client.show(name)
    assert (
        shown.capabilities == ["embedding"]
        and shown.modelinfo
        and shown.modelinfo["mlx.embedding_length"] == 384
    )
    assert len(r.embeddings) == 2 and len(r.embeddings[0]) == 384 and r.model == name
    for got, expected in zip(r.embeddings, want.data, strict=True):
        assert got == pytest.approx(expected.embedding, abs=1e-6)
    legacy = client.embeddings(model=name, prompt=texts[0])
    assert legacy.embedding == pytest.approx(r.embeddings[0], abs=1e-6)
    r = httpx.post(minilm.url + "/tokenize", json={"content": "hi"})
    assert r.status_code == 400 and "embedding model" in r.json()["error"]["message"]


# --- thinking, on a model that thinks in DeepSeek-R1's real format ------------------------------


@pytest.fixture(scope="module")
def r1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    path = r1_tiny(tmp_path_factory.mktemp("r1") / "model")
    proc = ServerProcess(["--model", str(path)], tmp_path_factory.mktemp("logs") / "r1-ollama.log")
    yield proc
    proc.close()


def test_reasoning_comes_back_as_thinking(r1: ServerProcess) -> None:
    client = ollama.Client(host=r1.url, timeout=120)
    asked: Any = [{"role": "user", "content": "Why is the sky blue?"}]
    r = client.chat(model="m", messages=asked, think=True, options={"temperature": 0, "num_predict": 12})
    want = openai.OpenAI(base_url=r1.url + "/v1", api_key="unused").chat.completions.create(
        model="m", messages=asked, max_tokens=12, temperature=0
    )
    reasoning = want.choices[0].message.model_extra or {}
    assert r.message.thinking and r.message.thinking == reasoning["reasoning_content"]
    assert r.message.content == (want.choices[0].message.content or "")
    parts = list(
        client.chat(
            model="m", messages=asked, think=True, options={"temperature": 0, "num_predict": 12}, stream=True
        )
    )
    assert "".join(p.message.thinking or "" for p in parts) == r.message.thinking
    assert "<think>" not in "".join(p.message.content or "" for p in parts)
