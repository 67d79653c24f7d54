"""Tier 3: the official openai SDK against a real Hypercorn serving the real default model."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from tests.support.server_proc import ServerProcess, assert_disconnect_stops_generation

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a very long story about a dragon who learns to cook."}]


@pytest.fixture(scope="module")
def client(smollm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0)


def test_chat_answers_the_question(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=30)
    assert "Paris" in (r.choices[0].message.content or "")
    assert r.choices[0].finish_reason == "stop"
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage is not None and r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_greedy_matches_mlx_lm_generate(client: openai.OpenAI, oracle: Any) -> None:
    for messages in (QUESTION, STORY):
        want, n = oracle(messages=messages, max_tokens=40)
        r = client.chat.completions.create(model="m", messages=messages, max_tokens=40, temperature=0)
        assert r.choices[0].message.content == want
        assert r.usage is not None and r.usage.completion_tokens == n


def test_chat_stream_equals_non_stream(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="m", messages=STORY, max_tokens=48)
    stream = client.chat.completions.create(
        model="m", messages=STORY, max_tokens=48, stream=True, stream_options={"include_usage": True}
    )
    pieces, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == whole.choices[0].message.content
    assert finish == "length" == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == 48


def test_completions_greedy_matches_mlx_lm_generate(client: openai.OpenAI, oracle: Any) -> None:
    prompt = "The three primary colors are"
    want, n = oracle(prompt=prompt, max_tokens=24)
    r = client.completions.create(model="m", prompt=prompt, max_tokens=24, temperature=0)
    assert r.choices[0].text == want and r.usage is not None and r.usage.completion_tokens == n
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(model="m", prompt=prompt, max_tokens=24, stream=True)
        if c.choices
    )
    assert streamed == want


def test_chat_stop_string_is_not_leaked(client: openai.OpenAI, oracle: Any) -> None:
    want, _ = oracle(messages=QUESTION, max_tokens=30)
    stop = "France"
    assert stop in want
    r = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=30, stop=[stop])
    assert r.choices[0].message.content == want[: want.index(stop)]
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model="m", messages=QUESTION, max_tokens=30, stop=stop, stream=True
        )
        if c.choices
    )
    assert streamed == want[: want.index(stop)]


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    def once(seed: int) -> str:
        r = client.chat.completions.create(
            model="m", messages=STORY, max_tokens=24, temperature=1.0, seed=seed
        )
        return r.choices[0].message.content or ""

    assert once(7) == once(7)
    assert len({once(s) for s in (1, 2, 3)}) > 1


def test_bad_requests_get_openai_400s(client: openai.OpenAI, smollm_server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=QUESTION, temperature=5)
    assert "temperature" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="m", messages=[])
    url = smollm_server.url + "/v1/chat/completions"
    for body in (b"{", b'{"messages": "hi"}', b'{"model": "m"}', b'{"messages": [{"role": 3}]}'):
        r = httpx.post(url, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, body
        err = r.json()["error"]
        assert set(err) >= {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    assert client.chat.completions.create(model="m", messages=QUESTION, max_tokens=5).choices


def test_disconnect_mid_stream_stops_generation(smollm_server: ServerProcess) -> None:
    body = {"messages": STORY, "max_tokens": 2000, "stream": True}
    assert_disconnect_stops_generation(smollm_server, "/v1/chat/completions", body, 6)


def test_health_answers_while_generating(smollm_server: ServerProcess) -> None:
    answers: list[float] = []
    done = threading.Event()

    def generate() -> None:
        httpx.post(
            smollm_server.url + "/v1/chat/completions",
            json={"messages": STORY, "max_tokens": 120},
            timeout=120,
        )
        done.set()

    t = threading.Thread(target=generate)
    t.start()
    while not done.is_set():
        start = time.perf_counter()
        assert httpx.get(smollm_server.url + "/health", timeout=5).status_code == 200
        answers.append(time.perf_counter() - start)
        time.sleep(0.02)
    t.join()
    assert len(answers) >= 10  # the loop kept answering throughout the generation


def test_second_turn_reuses_the_prefix_cache(client: openai.OpenAI, oracle: Any) -> None:
    first = client.chat.completions.create(model="m", messages=STORY, max_tokens=16)
    reply = first.choices[0].message.content or ""
    turn2 = [*STORY, {"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
    second = client.chat.completions.create(model="m", messages=turn2, max_tokens=16)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens  # type: ignore[union-attr]
    want, _ = oracle(messages=turn2, max_tokens=16)
    assert second.choices[0].message.content == want  # reusing KV changes nothing in the answer


def test_n_choices_share_one_prefill(
    client: openai.OpenAI, smollm_server: ServerProcess, oracle: Any
) -> None:
    want, _ = oracle(messages=QUESTION, max_tokens=12)
    before = smollm_server.stats()
    r = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=12, n=3)
    after = smollm_server.stats()
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == want for c in r.choices)  # greedy: every choice is the oracle's
    prompt = r.usage.prompt_tokens  # type: ignore[union-attr]
    computed = int(after["prefill_tokens"]) - int(before["prefill_tokens"])
    assert computed <= prompt + 2  # one prefill, plus the last prompt token of each other choice
    streamed = client.chat.completions.create(model="m", messages=QUESTION, max_tokens=12, n=2, stream=True)
    texts = ["", ""]
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [want, want]


def test_prompt_longer_than_the_context_is_400_with_both_numbers(smollm_server: ServerProcess) -> None:
    body = {"prompt": "hello " * 9000, "max_tokens": 8}
    r = httpx.post(smollm_server.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and "8192" in err["message"]
    assert any(int(n) >= 9000 for n in re.findall(r"\d+", err["message"]))  # the prompt's own size


def test_max_tokens_beyond_the_context_is_clamped_and_said(smollm_server: ServerProcess) -> None:
    body = {"messages": QUESTION, "max_tokens": 100000}
    r = httpx.post(smollm_server.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200
    assert "clamped" in r.headers["warning"] and "100000" in r.headers["warning"]
    assert "Paris" in r.json()["choices"][0]["message"]["content"]


def test_logprobs_agree_with_the_greedy_choice(client: openai.OpenAI) -> None:
    import math

    r = client.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=12, logprobs=True, top_logprobs=5, n=2
    )
    for choice in r.choices:  # two rows of one batch
        content = choice.logprobs.content  # type: ignore[union-attr]
        assert "".join(t.token for t in content) == choice.message.content  # type: ignore[union-attr]
        for t in content:  # type: ignore[union-attr]
            assert len(t.top_logprobs) == 5 and t.token == t.top_logprobs[0].token  # greedy = argmax
            assert t.logprob == max(a.logprob for a in t.top_logprobs) <= 0
            assert sum(math.exp(a.logprob) for a in t.top_logprobs) <= 1.0 + 1e-5
            assert bytes(t.bytes or []) == t.token.encode()
    streamed = client.chat.completions.create(
        model="m", messages=QUESTION, max_tokens=12, logprobs=True, stream=True
    )
    tokens = [
        t.token
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.content or []
    ]
    assert "".join(tokens) == r.choices[0].message.content
    legacy = client.completions.create(
        model="m", prompt="The three primary colors are", max_tokens=8, logprobs=3
    )
    lp = legacy.choices[0].logprobs
    assert lp is not None and len(lp.tokens or []) == len(lp.token_logprobs or []) == 8
    assert all(len(top) == 3 for top in lp.top_logprobs or [])
