"""ChatTokenizer: tools on a chat template that knows none are described, not dropped."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import jinja2

from mlx_serve.engine.model.tokenizer import TOOLS_FOOTER, TOOLS_HEADER, ChatTokenizer, template_uses_tools

# SmolLM2's kind: ChatML, no `tools` anywhere.
PLAIN = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WITH_TOOLS = "{% if tools %}TOOLS:{{ tools | tojson }}\n{% endif %}" + PLAIN
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {}}}},
}


@dataclass
class TemplateWrapper:
    """Duck-types mlx-lm's TokenizerWrapper: renders its Jinja template; a token per character."""

    chat_template: str | None
    calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template is not None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def apply_chat_template(
        self, messages: list[dict[str, Any]], tools: Any = None, **kwargs: Any
    ) -> list[int] | str:
        self.calls.append({"messages": messages, "tools": tools})
        text = (
            jinja2.Environment()
            .from_string(self.chat_template or "")
            .render(messages=messages, tools=tools, add_generation_prompt=kwargs.get("add_generation_prompt"))
        )
        return self.encode(text) if kwargs.get("tokenize", True) else text


def text_of(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def test_template_uses_tools_reads_the_template() -> None:
    assert not template_uses_tools(PLAIN)
    assert template_uses_tools(WITH_TOOLS)
    assert template_uses_tools({"default": PLAIN, "tool_use": WITH_TOOLS})
    assert not template_uses_tools(None)


def test_template_uses_tools_reads_loop_controls_exactly() -> None:
    # `{% break %}` parses (as mlx-lm's templates render it): the exact variable set decides, so a
    # template that only mentions tools in a comment does not take the tools, one that reads them does.
    breaking = (
        "{% for m in messages %}{% if loop.index > 8 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
    )
    assert not template_uses_tools(breaking + "{# no tools here #}")
    assert template_uses_tools(breaking + "{% if tools %}{{ tools | tojson }}{% endif %}")


def test_template_uses_tools_falls_back_to_the_text_when_it_does_not_parse() -> None:
    assert template_uses_tools("{% if tools %}{{ tools | tojson }}")  # unclosed block
    assert not template_uses_tools("{% if messages %}{{ messages }}")


def test_a_template_with_tools_gets_them_as_they_are() -> None:
    wrapper = TemplateWrapper(WITH_TOOLS)
    tok = ChatTokenizer(wrapper)
    assert tok.supports_tools
    tok.render_chat([{"role": "user", "content": "hi"}], [WEATHER])
    assert wrapper.calls[-1]["tools"] == [WEATHER]


def test_a_template_without_tools_gets_them_in_a_system_message() -> None:
    wrapper = TemplateWrapper(PLAIN)
    tok = ChatTokenizer(wrapper)
    assert not tok.supports_tools
    text = text_of(tok.render_chat([{"role": "user", "content": "hi"}], [WEATHER]))
    section = TOOLS_HEADER + json.dumps(WEATHER) + TOOLS_FOOTER
    assert (
        text
        == f"<|im_start|>system\n{section}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert wrapper.calls[-1]["tools"] is None


def test_the_tools_join_an_existing_system_message() -> None:
    tok = ChatTokenizer(TemplateWrapper(PLAIN))
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    text = text_of(tok.render_chat(messages, [WEATHER]))
    assert text.startswith("<|im_start|>system\nbe brief\n\n# Tools\n")
    assert text.count("<|im_start|>system") == 1


def test_past_calls_and_results_become_hermes_markup() -> None:
    tok = ChatTokenizer(TemplateWrapper(PLAIN))
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "windy"},
    ]
    text = text_of(tok.render_chat(messages, [WEATHER]))
    assert (
        '<|im_start|>assistant\nChecking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
        "\n</tool_call><|im_end|>\n"
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwindy\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    ) in text


def test_the_tools_count_in_the_prompt() -> None:
    tok = ChatTokenizer(TemplateWrapper(PLAIN))
    plain = tok.render_chat([{"role": "user", "content": "hi"}])
    with_tools = tok.render_chat([{"role": "user", "content": "hi"}], [WEATHER])
    assert len(with_tools) > len(plain) + len(json.dumps(WEATHER))


def test_no_template_still_describes_the_tools() -> None:
    tok = ChatTokenizer(TemplateWrapper(None))
    text = text_of(tok.render_chat([{"role": "user", "content": "hi"}], [WEATHER]))
    assert text.startswith("system: # Tools") and text.endswith("user: hi\nassistant:")


# Gemma's kind: a system message only first (a later one would be an error or, here, dropped).
SYSTEM_FIRST = (
    "{% for m in messages %}{% if m['role'] != 'system' or loop.first %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LATE_SYSTEM = [
    {"role": "system", "content": "rules"},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello"},
    {"role": "system", "content": "env: /work"},
    {"role": "user", "content": "go"},
]


def test_a_template_that_takes_system_turns_anywhere_gets_them_in_place() -> None:
    tok = ChatTokenizer(TemplateWrapper(PLAIN))
    assert tok.system_turns
    text = text_of(tok.render_chat(LATE_SYSTEM))
    assert "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>system\nenv: /work<|im_end|>" in text


def test_a_later_system_turn_joins_the_users_text_where_the_template_takes_none() -> None:
    tok = ChatTokenizer(TemplateWrapper(SYSTEM_FIRST))
    assert not tok.system_turns
    text = text_of(tok.render_chat(LATE_SYSTEM))
    assert text.startswith("<|im_start|>system\nrules<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")
    assert "<|im_start|>user\nenv: /work\n\ngo<|im_end|>" in text
    # After the user's own turn, it joins that turn's end: the tokens before stay as they were.
    last = text_of(tok.render_chat([*LATE_SYSTEM[:2], LATE_SYSTEM[3]]))
    assert "<|im_start|>user\nhi\n\nenv: /work<|im_end|>\n<|im_start|>assistant\n" in last


def test_a_template_that_raises_on_a_later_system_turn_is_probed_as_such() -> None:
    raising = SYSTEM_FIRST.replace(
        "{% endif %}{% endfor %}", "{% else %}{{ nope.call() }}{% endif %}{% endfor %}"
    )
    tok = ChatTokenizer(TemplateWrapper(raising))
    assert not tok.system_turns
    assert "env: /work" in text_of(tok.render_chat(LATE_SYSTEM))
