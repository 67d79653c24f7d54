"""Tier 1: chat templates as a bounded part of a request (issue 15, items 2, 4, 7).

A real transformers tokenizer and Jinja sandbox (tests/support/byte_tokenizer.py), no model.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from engine import templating
from engine.errors import ContextTooLong
from engine.templating import APPLY_OPTIONS, RenderLimits
from engine.tokenizer import ChatTokenizer
from tests.support.byte_tokenizer import CHATML, byte_tokenizer

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def wrapper() -> Any:
    return byte_tokenizer()


def test_template_kwargs_pass_template_variables_only(wrapper: Any) -> None:
    chat = ChatTokenizer(wrapper)
    plain = chat.render_chat(HELLO, None, {"enable_thinking": False})
    # Issue 15 item 2: apply_chat_template's options reshaped, replaced or broke the prompt.
    hostile = {
        "enable_thinking": False,
        "return_tensors": "np",
        "tokenize": False,
        "return_dict": True,
        "truncation": True,
        "max_length": 2,
        "padding": "max_length",
        "chat_template": "{{ 1/0 }}",
        "add_generation_prompt": False,
        "messages": [],
        "not_a_variable": "x",
    }
    assert chat.render_chat(HELLO, None, hostile) == plain
    assert all(type(t) is int for t in plain) and chat.decode(plain).endswith("assistant<think></think>")
    assert templating.template_variables(wrapper) >= {"messages", "tools", "enable_thinking"}  # type: ignore[operator]
    assert templating.template_kwargs(hostile, None) == {"enable_thinking": False, "not_a_variable": "x"}
    assert {"return_tensors", "tokenize", "truncation", "max_length", "padding"} <= APPLY_OPTIONS


@pytest.mark.parametrize(
    "body",
    [
        "{{ 1/0 }}",
        "{% for i in range(10**9) %}x{% endfor %}",  # the sandbox refuses the range
        "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",  # recursion without end
        "{{ messages[5]['content'] }}",
        "{{ raise_exception('no system prompt allowed') }}",
        "{% set x = messages.append(1) %}",  # the immutable sandbox refuses to modify a list
    ],
    ids=["zero-division", "huge-range", "recursive-macro", "missing-index", "raise", "sandbox"],
)
def test_template_faults_are_value_errors_with_their_message(body: str) -> None:
    chat = ChatTokenizer(byte_tokenizer(CHATML + body))
    with pytest.raises(ValueError, match="chat template failed"):
        chat.render_chat(HELLO)


def test_template_rendering_has_a_deadline() -> None:
    spin = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    wrapper = byte_tokenizer(CHATML + spin)
    started = time.monotonic()
    with pytest.raises(ValueError, match="longer than 0.3 s"):
        templating.render(wrapper, HELLO, None, {}, RenderLimits(timeout_s=0.3))
    assert time.monotonic() - started < 30  # 10^10 iterations without the deadline
    # The thread is left clean: the next render in it works, and nothing fires later.
    assert templating.render(byte_tokenizer(), HELLO, None, {}, RenderLimits(timeout_s=0.3))
    time.sleep(0.4)


def test_template_output_has_a_size_cap() -> None:
    wrapper = byte_tokenizer(CHATML + "{% for i in range(90000) %}{{ 'x' * 1000 }}{% endfor %}")
    with pytest.raises(ValueError, match="over 1,000,000 characters"):
        templating.render(wrapper, HELLO, None, {}, RenderLimits(max_chars=1_000_000))


def test_a_prompt_past_the_context_is_refused_from_a_prefix(wrapper: Any) -> None:
    # Issue 15 item 4: a 30 MB prompt was tokenized whole before the context check.
    seen: list[int] = []

    class Recording:
        def __getattr__(self, name: str) -> Any:
            return getattr(wrapper, name)

        def encode(self, text: str, **options: Any) -> list[int]:
            seen.append(len(text))
            return list(wrapper.encode(text, **options))

    chat = ChatTokenizer(Recording(), max_prompt_tokens=4096)
    with pytest.raises(ContextTooLong, match="maximum context length is 4096"):
        chat.encode("a" * 30_000_000)
    assert seen == [4096 * templating.PROBE_CHARS_PER_TOKEN]
    seen.clear()
    with pytest.raises(ContextTooLong):
        chat.render_chat([{"role": "user", "content": "b" * 30_000_000}])
    assert max(seen) == 4096 * templating.PROBE_CHARS_PER_TOKEN
    assert len(chat.encode("c" * 4000)) == 4000  # a prompt that fits is tokenized whole, once
