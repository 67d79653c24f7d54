"""Tier 3: a thinking budget on a model that thinks in DeepSeek-R1's real format.

The model is random-weight (tests.support.models.r1_tiny) with R1-Distill-Qwen's tokenizer and
template, which opens `<think>` for it: left alone it never closes its thinking. With a budget of
B the reasoning the client gets is exactly the first B tokens mlx-lm's own greedy generation
writes, then the engine forces `</think>` and the model's answer follows.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.support.models import r1_tiny
from tests.support.server_proc import ServerProcess

QUESTION = [{"role": "user", "content": "Why is the sky blue?"}]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def r1_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return r1_tiny(tmp_path_factory.mktemp("r1") / "model")


@pytest.fixture(scope="module")
def greedy(r1_path: Path) -> tuple[list[int], Any]:
    """mlx-lm's greedy tokens for QUESTION, with no budget: the oracle."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, tokenizer = load(str(r1_path))
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    steps = zip(generate_step(mx.array(prompt), model), range(MAX_TOKENS))
    tokens = [int(token) for (token, _), _ in steps]
    assert tokenizer.think_end_tokens[0] not in tokens  # it never closes its thinking alone
    return tokens, tokenizer


@pytest.fixture(scope="module")
def server(r1_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("r1-log") / "server.log"
    proc = ServerProcess(["--model", str(r1_path), "--reasoning-budget", "6"], log)
    yield proc
    proc.close()


def text(tokenizer: Any, tokens: list[int]) -> str:
    """`tokens` as mlx-lm's streaming detokenizer spells them (what the server streams)."""
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    for token in tokens:
        detokenizer.add_token(token)
    detokenizer.finalize()
    return str(detokenizer.text)


def chat(server: ServerProcess, **extra: Any) -> Any:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    return client.chat.completions.create(
        model="default", messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0, extra_body=extra or None
    )


@pytest.mark.parametrize("budget", [0, 1, 12])
def test_the_thinking_ends_at_exactly_the_budget_and_the_answer_follows(
    server: ServerProcess, greedy: tuple[list[int], Any], budget: int
) -> None:
    tokens, tokenizer = greedy
    answer = chat(server, thinking_budget_tokens=budget)
    message = answer.choices[0].message
    reasoning = getattr(message, "reasoning_content", None) or ""
    assert reasoning == text(tokenizer, tokens[:budget])
    assert message.content  # the model answers after the forced </think>
    assert answer.usage.completion_tokens == MAX_TOKENS


def test_the_servers_budget_applies_when_the_request_sets_none(
    server: ServerProcess, greedy: tuple[list[int], Any]
) -> None:
    tokens, tokenizer = greedy
    message = chat(server).choices[0].message
    assert message.reasoning_content == text(tokenizer, tokens[:6])  # type: ignore[attr-defined]


def test_a_budget_of_minus_one_is_unbounded(server: ServerProcess, greedy: tuple[list[int], Any]) -> None:
    tokens, tokenizer = greedy
    message = chat(server, thinking_budget_tokens=-1).choices[0].message
    assert message.reasoning_content == text(tokenizer, tokens) and not message.content  # type: ignore[attr-defined]


def test_the_budget_message_is_written_before_the_end_of_thinking(
    server: ServerProcess, greedy: tuple[list[int], Any]
) -> None:
    tokens, tokenizer = greedy
    note = " Time to answer."
    message = chat(server, thinking_budget_tokens=4, thinking_budget_message=note).choices[0].message
    assert message.reasoning_content == text(tokenizer, tokens[:4]) + note  # type: ignore[attr-defined]


def test_anthropic_budget_tokens_bound_the_thinking_block(
    server: ServerProcess, greedy: tuple[list[int], Any]
) -> None:
    tokens, tokenizer = greedy
    client = anthropic.Anthropic(base_url=server.url, api_key="none")
    reply = client.messages.create(
        model="default",
        max_tokens=MAX_TOKENS,  # the server's sampling is greedy (--temp 0)
        messages=QUESTION,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 3},
    )
    kinds = [block.type for block in reply.content]
    assert kinds[0] == "thinking" and "text" in kinds
    assert reply.content[0].thinking == text(tokenizer, tokens[:3])  # type: ignore[union-attr]


@pytest.mark.parametrize(("effort", "budget"), [(None, 6), ("none", 0)])
def test_responses_reasoning_runs_under_the_servers_budget_and_effort_none_closes_it(
    server: ServerProcess, greedy: tuple[list[int], Any], effort: str | None, budget: int
) -> None:
    tokens, tokenizer = greedy
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    extra: Any = {} if effort is None else {"reasoning": {"effort": effort}}
    response = client.responses.create(model="default", input=QUESTION, max_output_tokens=MAX_TOKENS, **extra)  # type: ignore[arg-type]
    thoughts = [c.text for item in response.output if item.type == "reasoning" for c in item.content or []]
    assert "".join(thoughts) == text(tokenizer, tokens[:budget])
    assert response.output_text


def test_a_budget_is_per_row_in_a_batch_and_streams_the_same(
    server: ServerProcess, greedy: tuple[list[int], Any]
) -> None:
    tokens, tokenizer = greedy
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")

    def streamed(budget: int) -> tuple[str, str]:
        chunks = client.chat.completions.create(
            model="default",
            messages=QUESTION,  # type: ignore[arg-type]
            max_tokens=MAX_TOKENS,
            stream=True,
            extra_body={"thinking_budget_tokens": budget},
        )
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        thought = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        return thought, "".join(d.content or "" for d in deltas)

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(streamed, [5, -1, 2, -1]))
    assert [r[0] for r in results] == [text(tokenizer, tokens[:n]) for n in (5, MAX_TOKENS, 2, MAX_TOKENS)]
    assert all(answer for _, answer in results[::2]) and not any(answer for _, answer in results[1::2])


def test_a_plain_completion_runs_under_the_servers_budget_and_keeps_its_thinking_in_the_text(
    server: ServerProcess, greedy: tuple[list[int], Any]
) -> None:
    """/v1/completions has no reasoning channel: the text is the continuation as the model wrote
    it, thinking and markers included, and the server's budget (6) closes the thinking there as
    it does on chat. Unbounded, it is mlx-lm's greedy text token for token."""
    tokens, tokenizer = greedy
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)  # leaves <think> open
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    bounded = client.completions.create(model="default", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    thought = text(tokenizer, tokens[:6]) + tokenizer.think_end
    assert bounded.choices[0].text.startswith(thought) and bounded.choices[0].text != thought
    assert bounded.usage is not None and bounded.usage.completion_tokens == MAX_TOKENS
    unbounded = client.completions.create(
        model="default",
        prompt=prompt,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"thinking_budget_tokens": -1},
    )
    assert unbounded.choices[0].text == text(tokenizer, tokens)
