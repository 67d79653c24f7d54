"""Tier 1: chat templates as a bounded part of a request (issue 15, items 2, 4, 7).

A real transformers tokenizer and Jinja sandbox (tests/support/byte_tokenizer.py), no model.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mlx_serve.engine.errors import ContextTooLong
from mlx_serve.engine.model import templating
from mlx_serve.engine.model.templating import APPLY_OPTIONS, RenderLimits
from mlx_serve.engine.model.tokenizer import ChatTokenizer, warm_prompt_path
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


def test_deadlines_share_one_watchdog_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """A render starts no thread of its own (a 64-client burst waited ~1.6 ms a request for
    one on a 2-core box); the watchdog, once started, serves them all."""
    templating.render(byte_tokenizer(), HELLO, None, {}, RenderLimits(timeout_s=5))
    started: list[str] = []
    start = threading.Thread.start

    def counted(self: threading.Thread) -> None:
        started.append(self.name)
        start(self)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for _ in range(200):
        with templating.deadline(5):
            pass
    assert templating.render(byte_tokenizer(), HELLO, None, {}, RenderLimits(timeout_s=5))
    assert started == []


def test_a_deadline_stops_only_its_own_thread() -> None:
    """Two renders at once, in two threads: the runaway one is stopped at its deadline, the
    other (a longer deadline, still running then) finishes untouched; an ended block's deadline
    never fires afterwards."""
    outcome: dict[str, str] = {}

    def spin(name: str, seconds: float, spins: float) -> None:
        try:
            with templating.deadline(seconds):
                until = time.monotonic() + spins
                while time.monotonic() < until:  # pure Python: where the async exception lands
                    pass
            outcome[name] = "finished"
        except templating.TemplateTimeout:
            outcome[name] = "stopped"

    runaway = threading.Thread(target=spin, args=("runaway", 0.2, 30.0))
    steady = threading.Thread(target=spin, args=("steady", 5.0, 0.6))
    started = time.monotonic()
    runaway.start(), steady.start()
    runaway.join(10), steady.join(10)
    assert outcome == {"runaway": "stopped", "steady": "finished"}
    assert time.monotonic() - started < 5
    spin("ended", 0.1, 0.0)  # its deadline passes while this thread spins on below
    spin("after", 5.0, 0.4)
    assert outcome["ended"] == "finished" and outcome["after"] == "finished"


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
    # A message just under the verbatim bound is rendered whole and refused from a prefix.
    assert chat.verbatim_bound is not None
    with pytest.raises(ContextTooLong):
        chat.render_chat([{"role": "user", "content": "b" * chat.verbatim_bound}])
    assert max(seen) == 4096 * templating.PROBE_CHARS_PER_TOKEN
    assert len(chat.encode("c" * 4000)) == 4000  # a prompt that fits is tokenized whole, once


class Spy:
    """The real wrapper, with the longest string each render was handed and each encode's length."""

    def __init__(self, wrapper: Any) -> None:
        self.wrapper, self.rendered, self.encoded = wrapper, [], []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapper, name)

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        self.rendered.append(max(len(str(m.get("content", ""))) for m in messages))
        return self.wrapper.apply_chat_template(messages, **kwargs)

    def encode(self, text: str, **options: Any) -> list[int]:
        self.encoded.append(len(text))
        return list(self.wrapper.encode(text, **options))


def test_a_message_past_any_context_is_refused_without_rendering_it_whole(wrapper: Any) -> None:
    # Issue 15: a 30 MB message was copied by the template several times, holding the GIL (and so
    # the event loop: /health) for tens of milliseconds, before the prefix check refused it.
    spy = Spy(wrapper)
    chat = ChatTokenizer(spy, max_prompt_tokens=4096)
    bound = chat.verbatim_bound
    assert bound is not None
    system = {"role": "system", "content": "be brief"}
    with pytest.raises(ContextTooLong, match=r"maximum context length is 4096 tokens.*30,000,000-character"):
        chat.render_chat([system, {"role": "user", "content": "  b" * 10_000_000}])
    assert spy.rendered and max(spy.rendered) < bound + 4 * templating.VERBATIM_MARGIN
    assert spy.encoded == []  # refused before tokenizing anything


def test_the_verbatim_bound_is_more_tokens_than_the_context_whatever_the_text(wrapper: Any) -> None:
    chat = ChatTokenizer(wrapper, max_prompt_tokens=4096)
    bound = chat.verbatim_bound
    assert bound is not None
    longest = max(wrapper.get_vocab(), key=len)  # a special token: the most characters one token covers
    worst = (longest * (bound // len(longest) + 1))[:bound]
    assert len(wrapper.encode(worst, add_special_tokens=False)) > 4096


def test_a_template_that_cuts_the_long_string_is_rendered_whole_and_fits() -> None:
    # The shortened render cannot tell what a template that slices content would write: the full
    # render decides, and a prompt that fits is served.
    cut = CHATML.replace("{{ message['content'] }}", "{{ message['content'][:40] }}")
    spy = Spy(byte_tokenizer(cut))
    chat = ChatTokenizer(spy, max_prompt_tokens=4096)
    ids = chat.render_chat([{"role": "user", "content": "x" * 3_000_000}])
    assert max(spy.rendered) == 3_000_000
    assert "x" * 40 + "<|im_end|>" in spy.wrapper.decode(ids)


def test_the_prompt_path_is_warmed_once_where_the_tokenizer_loads() -> None:
    """One render at load (the template's compile, the first encode), so a fresh server's first
    burst does not pay it in every request; a template that refuses it does not stop the load."""
    wrapper = byte_tokenizer()
    calls: list[Any] = []
    render = wrapper.apply_chat_template

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[0])
        return render(*args, **kwargs)

    wrapper.apply_chat_template = counted
    warm_prompt_path(wrapper)
    assert calls == [[{"role": "user", "content": "hello"}]]
    warm_prompt_path(byte_tokenizer(CHATML + "{{ raise_exception('no') }}"))  # does not raise
