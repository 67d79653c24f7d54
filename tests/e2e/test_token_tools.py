"""Tier 3: the token tools on the real default model behind a real Hypercorn: each count equals
the prompt_tokens a generation with the same body reports, for chat, Responses and tools."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support.server_proc import ServerProcess

pytestmark = pytest.mark.real

MESSAGES = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 2 + 2? 日本語も🙂"},
]
TOOLS: Any = [{"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}]  # fmt: skip


@pytest.fixture(scope="module")
def oa(smollm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0)


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> Any:
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_counts_equal_prompt_tokens(smollm_server: ServerProcess, oa: openai.OpenAI) -> None:
    for extra in ({}, {"tools": TOOLS}):
        body: Any = {"model": "m", "messages": MESSAGES, **extra}
        used = oa.chat.completions.create(**body, max_tokens=1).usage
        assert used is not None
        counted = post(smollm_server, "/v1/chat/completions/input_tokens", body)
        assert counted == {"object": "chat.completion.input_tokens", "input_tokens": used.prompt_tokens}
        tokenized = post(smollm_server, "/tokenize", body)
        assert tokenized["count"] == len(tokenized["tokens"]) == used.prompt_tokens
        assert tokenized["max_model_len"] == 8192


def test_responses_counts_equal_input_tokens(smollm_server: ServerProcess, oa: openai.OpenAI) -> None:
    tools: Any = [{"type": "function", **TOOLS[0]["function"]}]
    for extra in ({}, {"tools": tools}):
        body: Any = {
            "model": "m",
            "input": MESSAGES[1]["content"],
            "instructions": "Answer briefly.",
            **extra,
        }
        used = oa.responses.create(**body, max_output_tokens=16).usage
        assert used is not None
        counted = post(smollm_server, "/v1/responses/input_tokens", body)
        assert counted == {"object": "response.input_tokens", "input_tokens": used.input_tokens}


def test_tokenize_round_trips_and_apply_template_shows_the_prompt(
    smollm_server: ServerProcess, oa: openai.OpenAI
) -> None:
    text = "Hello world, 日本語 and 🙂 too"
    pieces = post(smollm_server, "/tokenize", {"content": text, "with_pieces": True})["tokens"]
    ids = [p["id"] for p in pieces]
    assert ids == post(smollm_server, "/tokenize", {"content": text})["tokens"]
    assert pieces[0]["piece"] == "Hello" and pieces[1]["piece"] == " world"
    split = post(smollm_server, "/tokenize", {"content": "🙂 日本語", "with_pieces": True})["tokens"]
    spelled = [p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in split]
    assert b"".join(spelled) == "🙂 日本語".encode() and {"本"} <= {
        p["piece"] for p in split if isinstance(p["piece"], str)
    }
    assert any(
        isinstance(p["piece"], list) for p in split
    )  # parts of a character come as bytes, as llama.cpp's
    assert post(smollm_server, "/detokenize", {"tokens": ids})["content"] == text
    prompt = post(smollm_server, "/apply-template", {"messages": MESSAGES})["prompt"]
    assert prompt.startswith("<|im_start|>system\nAnswer briefly.<|im_end|>") and prompt.endswith(
        "<|im_start|>assistant\n"
    )
    completed = oa.completions.create(model="m", prompt=prompt, max_tokens=1).usage
    chat = oa.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1).usage  # type: ignore[arg-type]
    assert completed is not None and chat is not None
    assert completed.prompt_tokens == chat.prompt_tokens  # the template's text is the chat's prompt


def test_token_tool_errors_are_openai_shaped(smollm_server: ServerProcess) -> None:
    r = httpx.post(smollm_server.url + "/detokenize", json={"tokens": [10**9]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens[0]"
    r = httpx.post(
        smollm_server.url + "/v1/chat/completions/input_tokens", json={"model": "m", "messages": []}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    metrics = httpx.get(smollm_server.url + "/metrics").text
    assert 'endpoint="/detokenize",method="POST",status="400"' in metrics
