"""Model outputs with tool calls, as each family writes them, and what a client must get back.

Written after the families' chat templates and model cards: the markup byte for byte, the
whitespace the models put around it, and the quirks seen in the wild (arguments before the
name, arguments as a JSON string, a raw newline inside a JSON string).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def tool(name: str, **properties: str) -> dict[str, Any]:
    """An OpenAI function tool whose parameters have these JSON-schema types."""
    props = {k: {"type": t} for k, t in properties.items()}
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": props}},
    }


WEATHER = tool("get_weather", city="string", days="integer")
WRITE_FILE = tool("write_file", path="string", content="string", overwrite="boolean", mode="integer")


@dataclass(frozen=True)
class Recorded:
    """One output: the family, the text the model wrote, the text and calls the client gets."""

    id: str
    family: str
    output: str
    text: str
    calls: tuple[tuple[str, dict[str, Any]], ...]
    tools: tuple[dict[str, Any], ...] = (WEATHER,)
    streams: bool = False  # the family streams its arguments (and starts calls early)


def calls(*pairs: tuple[str, dict[str, Any]]) -> tuple[tuple[str, dict[str, Any]], ...]:
    return pairs


PARIS = ("get_weather", {"city": "Paris"})
LYON = ("get_weather", {"city": "Lyon"})

RECORDED = [
    Recorded(
        "hermes-two-calls",
        "hermes",
        "I'll check both cities.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call>',
        "I'll check both cities.\n",
        calls(PARIS, LYON),
        streams=True,
    ),
    Recorded(
        "hermes-rich-arguments",
        "hermes",
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "notes/\u00e9t\u00e9.md", '
        r'"content": "# Title\n\nSee \"quotes\", \\ and \u2014 dashes.", "mode": 420, '
        '"tags": ["a", "b", []], "meta": {"draft": false, "score": -1.5e-3, "parent": null}}}'
        "\n</tool_call>",
        "",
        calls(
            (
                "write_file",
                {
                    "path": "notes/\u00e9t\u00e9.md",
                    "content": '# Title\n\nSee "quotes", \\ and \u2014 dashes.',
                    "mode": 420,
                    "tags": ["a", "b", []],
                    "meta": {"draft": False, "score": -1.5e-3, "parent": None},
                },
            )
        ),
        tools=(WRITE_FILE,),
        streams=True,
    ),
    Recorded(
        "hermes-text-around",
        "hermes",
        'Let me check. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris", '
        '"days": 3}}</tool_call> Anything else?',
        "Let me check.  Anything else?",
        calls(("get_weather", {"city": "Paris", "days": 3})),
        streams=True,
    ),
    Recorded(
        "hermes-arguments-before-name",
        "hermes",
        '<tool_call>\n{"arguments": {"city": "Paris"}, "name": "get_weather"}\n</tool_call>',
        "",
        calls(PARIS),
    ),  # arguments written before the name wait for it
    Recorded(
        "hermes-string-arguments",
        "hermes",
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
        "",
        calls(PARIS),
    ),  # a JSON string is passed on decoded, whole
    Recorded(
        "hermes-raw-newline-in-string",
        "hermes",
        '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.sh", '
        '"content": "echo one\necho two"}}\n</tool_call>',
        "",
        calls(("write_file", {"path": "a.sh", "content": "echo one\necho two"})),
        tools=(WRITE_FILE,),
        streams=True,
    ),
    Recorded(
        "json-tools-smollm",
        "json_tools",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>',
        "",
        calls(("get_weather", {"city": "Paris", "days": 2})),
        streams=True,
    ),
    Recorded(
        "qwen3-coder-xml",
        "qwen3_coder",
        "I'll create the file.\n<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/app.py\n"
        '</parameter>\n<parameter=content>\ndef main() -> None:\n    print("h\u00e9llo </param")\n\n'
        "</parameter>\n<parameter=overwrite>\ntrue\n</parameter>\n<parameter=mode>\n420\n"
        "</parameter>\n</function>\n</tool_call>",
        "I'll create the file.\n",
        calls(
            (
                "write_file",
                {
                    "path": "src/app.py",
                    "content": 'def main() -> None:\n    print("h\u00e9llo </param")\n',
                    "overwrite": True,
                    "mode": 420,
                },
            )
        ),
        tools=(WRITE_FILE,),
        streams=True,
    ),
    Recorded(
        "qwen3-coder-two-calls-null-and-untyped",
        "qwen3_coder",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
        "<function=get_weather>\n<parameter=city>\nNull\n</parameter>\n<parameter=note>\n"
        "nullable\n</parameter>\n</function>\n</tool_call>",
        "",
        calls(
            ("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": None, "note": "nullable"})
        ),
        streams=True,
    ),
    Recorded(
        "llama3-bare-json",
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        calls(PARIS),
        streams=True,
    ),
    Recorded(
        "llama3-two-calls",
        "llama3_json",
        '\n\n{"name": "get_weather", "parameters": {"city": "Paris"}}; '
        '{"name": "get_weather", "parameters": {"city": "Lyon"}}',
        "",
        calls(PARIS, LYON),
        streams=True,
    ),
    Recorded(
        "llama3-python-tag",
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        calls(PARIS),
        streams=True,
    ),
    Recorded(
        "mistral-headers",
        "mistral",
        'Checking both.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Lyon"}',
        "Checking both.",
        calls(PARIS, LYON),
        streams=True,
    ),
    Recorded(
        "mistral-json-list",
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "Ab3dE6gH9"}, '
        '{"name": "get_weather", "arguments": {"city": "Lyon"}, "id": "Zy8xW7vU6"}]',
        "",
        calls(PARIS, LYON),
        streams=True,
    ),
    Recorded(
        "gemma4",
        "gemma4",
        '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>',
        "",
        calls(("get_weather", {"city": "Paris", "days": 3})),
    ),
    Recorded(
        "function-gemma",
        "function_gemma",
        "<start_function_call>call:get_weather{city:<escape>Paris<escape>,days:3}<end_function_call>",
        "",
        calls(("get_weather", {"city": "Paris", "days": 3})),
    ),
    Recorded(
        "pythonic-lfm2",
        "pythonic",
        '<|tool_call_start|>[get_weather(city="Paris", days=3), get_weather(city="Lyon")]'
        "<|tool_call_end|>Checking both.",
        "Checking both.",
        calls(("get_weather", {"city": "Paris", "days": 3}), LYON),
    ),
    Recorded(
        "glm47",
        "glm47",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
        "",
        calls(PARIS),
    ),
    Recorded(
        "kimi-k2",
        "kimi_k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
        "",
        calls(PARIS),
    ),
    Recorded(
        "minimax-m2",
        "minimax_m2",
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
        "</invoke>\n</minimax:tool_call>",
        "",
        calls(PARIS),
    ),
]

# Markup that is not a call: it must come back as the very text the model wrote.
NOT_CALLS = [
    ("hermes", "a <tool_call>not json</tool_call> b"),
    ("hermes", 'a <tool_call>{"arguments": {"city": "Paris"}}</tool_call> b'),
    ("hermes", '<tool_call>{"name": 42, "arguments": {}}</tool_call>'),
    ("hermes", "<tool_call>\n</tool_call>"),
    ("hermes", "x <tool_calm"),
    ("qwen3_coder", "<tool_call>\nplain words\n</tool_call> after"),
    ("qwen3_coder", "<tool_call>\n<function=get weather>\n</function>\n</tool_call>"),
    ("gemma4", "<|tool_call>nonsense<tool_call|>"),
    ("pythonic", "<|tool_call_start|>not python (<|tool_call_end|>"),
    ("llama3_json", '{"city": "Paris", "temperature": 21}'),
    ("llama3_json", '{"name": "launch_rockets", "parameters": {}}'),  # not an offered tool
    ("llama3_json", "The weather in Paris is sunny."),
    ("mistral", "[TOOL_CALLS]not a call"),
]
