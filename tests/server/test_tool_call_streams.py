"""Streamed tool calls through a real Hypercorn, read by the real SDKs' stream helpers.

A scripted engine writes a turn with text and two tool calls, token by token, in a model
family's markup. Each SDK's stream helper must assemble the very answer the same SDK gets
non-streamed, and the arguments must really have arrived in several pieces.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest

from mlx_serve.server.app import App
from mlx_serve.server.config import Config
from tests.support.fake_engine import fake_engine
from tests.support.hypercorn_app import hypercorn_serving

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
CHAT_TOOL: Any = {"type": "function", "function": {"name": "get_weather", "parameters": PARAMETERS}}
RESPONSES_TOOL: Any = {"type": "function", "name": "get_weather", "parameters": PARAMETERS}
ANTHROPIC_TOOL: Any = {"name": "get_weather", "input_schema": PARAMETERS}
ASK: Any = [{"role": "user", "content": "Weather in Paris and Lyon?"}]
TEXT = "Let me check both."
CALLS = [("get_weather", {"city": "Paris", "days": 3}), ("get_weather", {"city": "Lyon", "days": 2})]

# The same turn as two families write it, cut the way a tokenizer would.
TOKENS = {
    "hermes": [
        "Let",
        " me",
        " check",
        " both",
        ".",
        "\n",
        "<tool",
        "_call",
        ">\n",
        '{"',
        "name",
        '":',
        ' "',
        "get",
        "_weather",
        '",',
        ' "',
        "arguments",
        '":',
        ' {"',
        "city",
        '":',
        ' "',
        "Par",
        "is",
        '",',
        ' "',
        "days",
        '":',
        " ",
        "3",
        "}}\n",
        "</",
        "tool",
        "_call",
        ">\n",
        "<tool_call>",
        '\n{"name": "get_weather", ',
        '"arguments": {"city": ',
        '"Ly',
        'on", "days": 2',
        "}}",
        "\n</tool_call>",
    ],
    "qwen3_coder": [
        "Let me check",
        " both.",
        "\n",
        "<tool_call>",
        "\n",
        "<function=",
        "get_weather",
        ">\n",
        "<parameter=",
        "city",
        ">\n",
        "Par",
        "is",
        "\n",
        "</parameter>",
        "\n",
        "<parameter=",
        "days",
        ">\n",
        "3",
        "\n",
        "</parameter>",
        "\n",
        "</function>",
        "\n",
        "</tool_call>",
        "\n",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n",
        "Ly",
        "on",
        "\n</parameter>\n",
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    ],
}


# max_tokens that ends each script inside the second call's arguments, after "Lyon".
CUT = {"hermes": 41, "qwen3_coder": 31}


@dataclass(frozen=True)
class Served:
    url: str
    family: str


@pytest.fixture(scope="module", params=sorted(TOKENS))
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    family = request.param
    engine, _ = fake_engine(TOKENS[family], tool_parser=family)
    with hypercorn_serving(App(Config(served_model_name=["m"]), engine)) as url:
        yield Served(url, family)


def test_openai_chat_stream_helper_assembles_the_json_answer(served: Served) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="k", max_retries=0)
    whole = client.chat.completions.create(model="m", messages=ASK, tools=[CHAT_TOOL])
    pieces: dict[int, int] = {}
    firsts: list[Any] = []
    with client.chat.completions.stream(model="m", messages=ASK, tools=[CHAT_TOOL]) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                pieces[event.index] = pieces.get(event.index, 0) + 1
            elif event.type == "chunk":
                firsts += [c for c in event.chunk.choices[0].delta.tool_calls or [] if c.id]
        streamed = stream.get_final_completion()

    def answer(c: Any) -> Any:
        m = c.choices[0].message
        return (
            m.content,
            c.choices[0].finish_reason,
            [(t.type, t.function.name, json.loads(t.function.arguments)) for t in m.tool_calls],
        )

    assert (
        answer(streamed)
        == answer(whole)
        == (TEXT + "\n", "tool_calls", [("function", n, a) for n, a in CALLS])
    )
    assert all(pieces[i] > 1 for i in range(len(CALLS))), pieces
    assert [(f.index, f.type, f.function.name, f.function.arguments) for f in firsts] == [
        (i, "function", name, "") for i, (name, _) in enumerate(CALLS)
    ]
    ids = [t.id for t in streamed.choices[0].message.tool_calls or []]
    assert ids == [f.id for f in firsts] and all(i.startswith("call_") for i in ids)


def test_openai_responses_stream_helper_assembles_the_json_answer(served: Served) -> None:
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="k", max_retries=0)
    whole = client.responses.create(model="m", input=ASK, tools=[RESPONSES_TOOL])
    deltas: dict[int, list[str]] = {}
    added: list[Any] = []
    with client.responses.stream(model="m", input=ASK, tools=[RESPONSES_TOOL]) as stream:
        for event in stream:
            if event.type == "response.function_call_arguments.delta":
                deltas.setdefault(event.output_index, []).append(event.delta)
            elif event.type == "response.output_item.added" and event.item.type == "function_call":
                added.append(event.item)
        streamed = stream.get_final_response()

    def answer(r: Any) -> Any:
        return [
            (o.type, o.status, o.content[0].text)
            if o.type == "message"
            else (o.type, o.status, o.name, json.loads(o.arguments))
            for o in r.output
        ]

    assert (
        answer(streamed)
        == answer(whole)
        == [("message", "completed", TEXT + "\n")] + [("function_call", "completed", n, a) for n, a in CALLS]
    )
    # The final response is the server's own; the deltas alone must add up to the same calls.
    assert [(i, json.loads("".join(d))) for i, d in sorted(deltas.items())] == [
        (i + 1, a) for i, (_, a) in enumerate(CALLS)
    ]
    assert all(len(d) > 1 for d in deltas.values()), deltas
    assert [(a.name, a.arguments, a.status) for a in added] == [(n, "", "in_progress") for n, _ in CALLS]


def test_anthropic_stream_helper_assembles_the_json_answer(served: Served) -> None:
    client = anthropic.Anthropic(base_url=served.url, api_key="k", max_retries=0)
    whole = client.messages.create(model="m", max_tokens=200, messages=ASK, tools=[ANTHROPIC_TOOL])
    pieces: dict[int, int] = {}
    with client.messages.stream(model="m", max_tokens=200, messages=ASK, tools=[ANTHROPIC_TOOL]) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                pieces[event.index] = pieces.get(event.index, 0) + 1
        streamed = stream.get_final_message()

    def answer(m: Any) -> Any:
        return m.stop_reason, [
            (b.type, b.text) if b.type == "text" else (b.type, b.name, b.input) for b in m.content
        ]

    assert (
        answer(streamed)
        == answer(whole)
        == ("tool_use", [("text", TEXT + "\n")] + [("tool_use", n, a) for n, a in CALLS])
    )
    assert sorted(pieces) == [1, 2] and all(n > 1 for n in pieces.values()), pieces
    assert all(b.id.startswith("toolu_") for b in streamed.content if b.type == "tool_use")


def test_a_call_cut_by_max_tokens_reads_the_same_streamed_or_not(served: Served) -> None:
    """max_tokens ends the turn inside the second call's arguments: each SDK reads the
    arguments written so far the same way from the stream as from the JSON answer."""
    cut = CUT[served.family]
    oa = openai.OpenAI(base_url=served.url + "/v1", api_key="k", max_retries=0)
    whole = oa.chat.completions.create(model="m", messages=ASK, tools=[CHAT_TOOL], max_tokens=cut)
    with (
        pytest.raises(openai.LengthFinishReasonError) as info,  # the helper's way to say "cut"
        oa.chat.completions.stream(model="m", messages=ASK, tools=[CHAT_TOOL], max_tokens=cut) as s,
    ):
        s.get_final_completion()
    streamed = info.value.completion
    chat = [
        [(t.function.name, t.function.arguments) for t in c.choices[0].message.tool_calls or []]
        + [c.choices[0].finish_reason]
        for c in (whole, streamed)
    ]
    assert chat[0] == chat[1] and chat[0][-1] == "length" and chat[0][1][1].startswith('{"city": "Lyon"')

    r_whole = oa.responses.create(model="m", input=ASK, tools=[RESPONSES_TOOL], max_output_tokens=cut)
    with oa.responses.stream(model="m", input=ASK, tools=[RESPONSES_TOOL], max_output_tokens=cut) as s:
        # The helper's final response waits for response.completed; a cut turn ends incomplete.
        r_streamed = next(e.response for e in s if e.type == "response.incomplete")
    items = [
        [(o.type, o.status, getattr(o, "arguments", None)) for o in r.output] + [r.status]
        for r in (r_whole, r_streamed)
    ]
    assert items[0] == items[1] and items[0][-2][1] == "incomplete" and items[0][-1] == "incomplete"

    an = anthropic.Anthropic(base_url=served.url, api_key="k", max_retries=0)
    m_whole = an.messages.create(model="m", max_tokens=cut, messages=ASK, tools=[ANTHROPIC_TOOL])
    with an.messages.stream(model="m", max_tokens=cut, messages=ASK, tools=[ANTHROPIC_TOOL]) as s:
        m_streamed = s.get_final_message()
    blocks = [
        [(b.type, getattr(b, "input", None)) for b in m.content] + [m.stop_reason]
        for m in (m_whole, m_streamed)
    ]
    assert blocks[0] == blocks[1] and blocks[0][-2][1]["city"] == "Lyon"
    assert blocks[0][-1] == "max_tokens"
