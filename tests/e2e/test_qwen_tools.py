"""Tier 3: a real tool-calling model calls real tools through the official SDKs.

Qwen2.5-Coder-0.5B-Instruct (`--model qwen2.5-coder-0.5b`, float32 on a CPU, greedy) behind a
real Hypercorn; the openai SDK for chat completions and Responses, the anthropic SDK for
Messages; each streamed (argument deltas assembled by the SDK's own stream helper) and not;
tool_choice auto, required and named on each.

What the model does, so that the prompts below are understood: offered get_weather and asked
about the weather, it writes the call as bare JSON (the Qwen2.5-Coder models never write the
`<tool_call>` markup their template asks for), which the server's `qwen2_5` tool format reads as
a call; offered get_time as well, it writes the same call in a ```json fence, which is left as
text, so auto mode is offered get_weather alone (required and named are offered both). Handed its tool's result straight after its own call, it calls again (the 1.5B too);
after one answered exchange earlier in the conversation it answers from the result. The round
trips carry such an exchange, and their answers must quote the result's numbers, which the
model cannot guess.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.models import qwen_folder
from tests.support.server_proc import ServerProcess

pytestmark = pytest.mark.real

QUESTION = "What's the weather in Paris?"
CITY = {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"]}  # fmt: skip
WEATHER = ("get_weather", "Get the current weather in a city")
TIME = ("get_time", "Get the current local time in a city")
BOTH_CHAT_TOOLS: Any = [{"type": "function", "function": {"name": n, "description": d, "parameters": CITY}}
                        for n, d in (WEATHER, TIME)]  # fmt: skip
BOTH_ANTHROPIC_TOOLS: Any = [{"name": n, "description": d, "input_schema": CITY} for n, d in (WEATHER, TIME)]
BOTH_RESPONSES_TOOLS: Any = [{"type": "function", "name": n, "description": d, "parameters": CITY}
                             for n, d in (WEATHER, TIME)]  # fmt: skip
CHAT_TOOLS, ANTHROPIC_TOOLS, RESPONSES_TOOLS = (
    BOTH_CHAT_TOOLS[:1],
    BOTH_ANTHROPIC_TOOLS[:1],
    BOTH_RESPONSES_TOOLS[:1],
)
PARIS = {"city": "Paris"}


def weather(city: str) -> str:
    """The tool the client runs: values the model cannot guess."""
    return {"Berlin": "Cloudy, 12 °C", "Paris": "Light rain, 17 °C"}[city]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    qwen_folder("qwen2.5-coder-0.5b")  # joined and converted before the clock starts
    log: Path = tmp_path_factory.mktemp("logs") / "qwen-server.log"
    proc = ServerProcess(["--model", "qwen2.5-coder-0.5b", "--max-tokens", "48"], log)
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def chat(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def claude(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=300)


def test_server_serves_the_shortcut_by_its_model_id(server: ServerProcess) -> None:
    models = httpx.get(server.url + "/v1/models").json()["data"]
    assert models[0]["id"] == "Qwen2.5-Coder-0.5B-Instruct"  # then the test clients' aliases
    assert models[0]["context_length"] == 32768


# --- OpenAI chat completions -------------------------------------------------------------------


def test_chat_auto_calls_the_tool(chat: openai.OpenAI) -> None:
    r = chat.chat.completions.create(model="m", messages=[{"role": "user", "content": QUESTION}],
                                     tools=CHAT_TOOLS, tool_choice="auto")  # fmt: skip

    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", PARIS)


def test_chat_auto_call_streams_its_arguments(chat: openai.OpenAI) -> None:
    with chat.chat.completions.stream(model="m", messages=[{"role": "user", "content": QUESTION}],
                                      tools=CHAT_TOOLS) as stream:  # fmt: skip
        deltas = [e.arguments_delta for e in stream if e.type == "tool_calls.function.arguments.delta"]
        final = stream.get_final_completion()

    (call,) = final.choices[0].message.tool_calls or []
    assert final.choices[0].finish_reason == "tool_calls" and len(deltas) > 2
    assert (call.function.name, json.loads("".join(deltas))) == ("get_weather", PARIS)
    assert call.function.arguments == "".join(deltas)


def test_chat_required_and_named_tool_choice(chat: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": QUESTION}]
    required = chat.chat.completions.create(model="m", messages=messages, tools=BOTH_CHAT_TOOLS,
                                            tool_choice="required")  # fmt: skip
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    with chat.chat.completions.stream(
        model="m", messages=messages, tools=BOTH_CHAT_TOOLS, tool_choice=named
    ) as s:
        streamed = s.get_final_completion()

    calls = [required.choices[0].message.tool_calls or [], streamed.choices[0].message.tool_calls or []]
    assert [[(c.function.name, json.loads(c.function.arguments)) for c in cs] for cs in calls] == [
        [("get_weather", PARIS)],
        [("get_time", PARIS)],
    ]
    assert required.choices[0].finish_reason == streamed.choices[0].finish_reason == "tool_calls"


def test_chat_round_trip_answers_from_the_tool_result(chat: openai.OpenAI) -> None:
    asked: Any = {"role": "user", "content": QUESTION}
    first = chat.chat.completions.create(model="m", messages=[asked], tools=CHAT_TOOLS)
    (call,) = first.choices[0].message.tool_calls or []
    result = weather(**json.loads(call.function.arguments))

    earlier: Any = [
        {"role": "user", "content": "What's the weather in Berlin?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Berlin"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": weather("Berlin")},
        {"role": "assistant", "content": "It is cloudy and 12 °C in Berlin."},
    ]  # fmt: skip
    returned: Any = first.choices[0].message.model_dump(exclude_none=True)
    final = chat.chat.completions.create(model="m", tools=CHAT_TOOLS, messages=[
        *earlier, asked, returned, {"role": "tool", "tool_call_id": call.id, "content": result}])  # fmt: skip

    answer = final.choices[0].message.content or ""
    assert final.choices[0].finish_reason == "stop" and "17 °C" in answer and "rain" in answer


# --- Anthropic Messages --------------------------------------------------------------------------


def test_anthropic_auto_calls_the_tool(claude: anthropic.Anthropic) -> None:
    m = claude.messages.create(model="m", max_tokens=48, messages=[{"role": "user", "content": QUESTION}],
                               tools=ANTHROPIC_TOOLS, tool_choice={"type": "auto"})  # fmt: skip

    (block,) = m.content
    assert m.stop_reason == "tool_use" and block.type == "tool_use" and block.id.startswith("toolu_")
    assert (block.name, block.input) == ("get_weather", PARIS)


def test_anthropic_auto_call_streams_its_input(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model="m", max_tokens=48, messages=[{"role": "user", "content": QUESTION}],
                                tools=ANTHROPIC_TOOLS) as stream:  # fmt: skip
        deltas = [e.partial_json for e in stream if e.type == "input_json"]
        m = stream.get_final_message()

    (block,) = m.content
    assert m.stop_reason == "tool_use" and len(deltas) > 2 and json.loads("".join(deltas)) == PARIS
    assert block.type == "tool_use" and (block.name, block.input) == ("get_weather", PARIS)


def test_anthropic_any_and_named_tool_choice(claude: anthropic.Anthropic) -> None:
    messages: Any = [{"role": "user", "content": QUESTION}]
    anyone = claude.messages.create(model="m", max_tokens=48, messages=messages, tools=BOTH_ANTHROPIC_TOOLS,
                                    tool_choice={"type": "any", "disable_parallel_tool_use": True})  # fmt: skip
    with claude.messages.stream(model="m", max_tokens=48, messages=messages, tools=BOTH_ANTHROPIC_TOOLS,
                                tool_choice={"type": "tool", "name": "get_time"}) as stream:  # fmt: skip
        named = stream.get_final_message()

    blocks = [(b.type, getattr(b, "name", None), getattr(b, "input", None)) for m in (anyone, named)
              for b in m.content]  # fmt: skip
    assert blocks == [("tool_use", "get_weather", PARIS), ("tool_use", "get_time", PARIS)]
    assert anyone.stop_reason == named.stop_reason == "tool_use"


def test_anthropic_round_trip_answers_from_the_tool_result(claude: anthropic.Anthropic) -> None:
    asked: Any = {"role": "user", "content": QUESTION}
    first = claude.messages.create(model="m", max_tokens=48, messages=[asked], tools=ANTHROPIC_TOOLS)
    (use,) = first.content
    assert use.type == "tool_use"
    earlier: Any = [
        {"role": "user", "content": "What's the weather in Berlin?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_0", "name": "get_weather",
                                           "input": {"city": "Berlin"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_0",
                                      "content": weather("Berlin")}]},
        {"role": "assistant", "content": "It is cloudy and 12 °C in Berlin."},
    ]  # fmt: skip
    result: Any = {"type": "tool_result", "tool_use_id": use.id, "content": weather(**use.input)}  # type: ignore[arg-type]
    final = claude.messages.create(model="m", max_tokens=48, tools=ANTHROPIC_TOOLS, messages=[
        *earlier, asked, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}])  # fmt: skip

    answer = "".join(b.text for b in final.content if b.type == "text")
    assert final.stop_reason == "end_turn" and "17 °C" in answer and "rain" in answer


# --- OpenAI Responses ----------------------------------------------------------------------------


def test_responses_auto_calls_the_tool(chat: openai.OpenAI) -> None:
    r = chat.responses.create(model="m", input=[{"role": "user", "content": QUESTION}], tools=RESPONSES_TOOLS,
                              tool_choice="auto")  # fmt: skip

    (item,) = r.output
    assert r.status == "completed" and item.type == "function_call"
    assert (item.name, json.loads(item.arguments)) == ("get_weather", PARIS)


def test_responses_auto_call_streams_its_arguments(chat: openai.OpenAI) -> None:
    with chat.responses.stream(model="m", input=[{"role": "user", "content": QUESTION}],
                               tools=RESPONSES_TOOLS) as stream:  # fmt: skip
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()

    (item,) = final.output
    assert final.status == "completed" and item.type == "function_call" and len(deltas) > 2
    assert (item.name, item.arguments, json.loads(item.arguments)) == ("get_weather", "".join(deltas), PARIS)


def test_responses_required_and_named_tool_choice(chat: openai.OpenAI) -> None:
    ask: Any = [{"role": "user", "content": QUESTION}]
    required = chat.responses.create(model="m", input=ask, tools=BOTH_RESPONSES_TOOLS, tool_choice="required")
    with chat.responses.stream(model="m", input=ask, tools=BOTH_RESPONSES_TOOLS,
                               tool_choice={"type": "function", "name": "get_time"}) as stream:  # fmt: skip
        named = stream.get_final_response()

    items = [(o.type, getattr(o, "name", None), json.loads(getattr(o, "arguments", "null")))
             for r in (required, named) for o in r.output]  # fmt: skip
    assert items == [("function_call", "get_weather", PARIS), ("function_call", "get_time", PARIS)]


def test_responses_round_trip_answers_from_the_tool_result(chat: openai.OpenAI) -> None:
    asked: Any = {"role": "user", "content": QUESTION}
    first = chat.responses.create(model="m", input=[asked], tools=RESPONSES_TOOLS)
    (call,) = first.output
    assert call.type == "function_call"
    earlier: Any = [
        {"role": "user", "content": "What's the weather in Berlin?"},
        {
            "type": "function_call",
            "call_id": "call_0",
            "name": "get_weather",
            "arguments": '{"city": "Berlin"}',
        },
        {"type": "function_call_output", "call_id": "call_0", "output": weather("Berlin")},
        {"role": "assistant", "content": "It is cloudy and 12 °C in Berlin."},
    ]
    output: Any = {"type": "function_call_output", "call_id": call.call_id,
                   "output": weather(**json.loads(call.arguments))}  # fmt: skip
    final = chat.responses.create(model="m", tools=RESPONSES_TOOLS, input=[
        *earlier, asked, {"type": "function_call", "call_id": call.call_id, "name": call.name,
                          "arguments": call.arguments}, output])  # fmt: skip

    assert final.status == "completed" and "17 °C" in final.output_text and "rain" in final.output_text
