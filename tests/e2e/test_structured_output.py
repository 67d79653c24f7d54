"""Tier 3: structured output and forced tool calls through the official SDKs, on the real model.

SmolLM2-135M left alone rarely writes a valid tool call or schema-shaped JSON; here the grammar
makes it, and the SDKs' own parsers (`.parse()`, tool-call types) read the answers.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import anthropic
import openai
import pydantic
import pytest

from tests.support.json_check import errors
from tests.support.server_proc import ServerProcess

WHERE: Any = [{"role": "user", "content": "Where is the Eiffel Tower? Answer as JSON."}]
WEATHER_Q: Any = [{"role": "user", "content": "What's the weather in Paris?"}]
WEATHER_PARAMS: Any = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 40}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_PARAMS: Any = {
    "type": "object",
    "properties": {"tz": {"enum": ["UTC", "CET"]}},
    "required": ["tz"],
    "additionalProperties": False,
}
CHAT_TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER_PARAMS},
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time in a zone", "parameters": TIME_PARAMS},
    },
]
ANTHROPIC_TOOLS: Any = [
    {
        "name": t["function"]["name"],
        "description": t["function"]["description"],
        "input_schema": t["function"]["parameters"],
    }
    for t in CHAT_TOOLS
]
RESPONSES_TOOLS: Any = [{"type": "function", **t["function"]} for t in CHAT_TOOLS]
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
BAD_SCHEMA: Any = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
BAD_MESSAGE = "invalid JSON schema: Pointer '/$defs/missing' does not exist"


class Place(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=40)
    country: str = pydantic.Field(max_length=40)
    continent: Literal["Europe", "Asia", "Africa", "America", "Oceania"]


@pytest.fixture(scope="module")
def client(smollm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def claude(smollm_server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=smollm_server.url, api_key="unused", max_retries=0)


def assert_valid_call(name: str, arguments: str | dict[str, Any]) -> None:
    value = json.loads(arguments) if isinstance(arguments, str) else arguments
    assert errors(value, PARAMS[name]) == [], (name, value)


# --- OpenAI chat and completions ----------------------------------------------------------------


def test_chat_parse_with_a_pydantic_schema(client: openai.OpenAI) -> None:
    r = client.chat.completions.parse(model="m", messages=WHERE, response_format=Place, max_tokens=80)
    place = r.choices[0].message.parsed
    assert r.choices[0].finish_reason == "stop" and isinstance(place, Place)
    assert place.city == "Paris"  # the grammar shapes the answer; the model still knows it


def test_chat_stream_follows_a_strict_json_schema(client: openai.OpenAI) -> None:
    schema = Place.model_json_schema()
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}}
    stream = client.chat.completions.create(
        model="m", messages=WHERE, response_format=fmt, max_tokens=80, stream=True
    )
    pieces, finish = [], None
    for chunk in stream:
        pieces += [c.delta.content or "" for c in chunk.choices]
        finish = next((c.finish_reason for c in chunk.choices if c.finish_reason), finish)
    assert finish == "stop" and Place.model_validate_json("".join(pieces))


def test_chat_tool_choice_required_is_a_valid_tool_call(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="m", messages=WEATHER_Q, tools=CHAT_TOOLS, tool_choice="required", max_tokens=80
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.type == "function"
        assert_valid_call(call.function.name, call.function.arguments)


def test_chat_named_tool_choice_streams_that_call(client: openai.OpenAI) -> None:
    named: Any = {"type": "function", "function": {"name": "get_time"}}
    stream = client.chat.completions.create(
        model="m", messages=WEATHER_Q, tools=CHAT_TOOLS, tool_choice=named, max_tokens=80, stream=True
    )
    names, arguments, finish, text = [], "", None, ""
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            for call in c.delta.tool_calls or ():
                names += [call.function.name] if call.function and call.function.name else []
                arguments += (call.function.arguments or "") if call.function else ""
            finish = c.finish_reason or finish
    assert (names, text, finish) == (["get_time"], "", "tool_calls")
    assert_valid_call("get_time", arguments)


def test_guided_choice_regex_and_grammar(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model="m",
        prompt="The best color is",
        max_tokens=10,
        n=3,
        temperature=1.0,
        seed=7,
        extra_body={"guided_choice": ["red", "green", "blue"]},
    )
    assert {c.text for c in r.choices} <= {"red", "green", "blue"}
    assert {c.finish_reason for c in r.choices} == {"stop"}
    phone = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Give me a phone number."}],
        max_tokens=30,
        extra_body={"structured_outputs": {"regex": r"\(\d{3}\) \d{3}-\d{4}"}},
    )
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", phone.choices[0].message.content or "")
    lark = 'start: ANSWER ", because " REASON "."\nANSWER: "yes" | "no"\nREASON: /[a-z ]{1,40}/'
    why = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Is Paris in France?"}],
        max_tokens=40,
        extra_body={"guided_grammar": lark},
    )
    answer = why.choices[0].message.content or ""
    assert answer.split(",")[0] in ("yes", "no") and answer.endswith(".")
    assert why.choices[0].finish_reason == "stop"


def test_chat_schema_that_does_not_compile_is_400_before_the_stream(client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_SCHEMA}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=WHERE, response_format=fmt, stream=True)
    assert info.value.status_code == 400 and BAD_MESSAGE in info.value.message
    assert info.value.param == "response_format.json_schema.schema"


# --- Responses ---------------------------------------------------------------------------------


def test_responses_parse_with_a_pydantic_schema(client: openai.OpenAI) -> None:
    r = client.responses.parse(model="m", input=WHERE, text_format=Place, max_output_tokens=80)
    assert r.status == "completed" and isinstance(r.output_parsed, Place)


def test_responses_named_tool_choice_streams_a_function_call(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="m",
        input=WEATHER_Q,
        tools=RESPONSES_TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=80,
    ) as stream:
        final = stream.get_final_response()
    (item,) = final.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert_valid_call(item.name, item.arguments)


def test_responses_schema_that_does_not_compile_is_400(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="m", input="hi", text={"format": {"type": "json_schema", "name": "x", "schema": BAD_SCHEMA}}
        )
    assert BAD_MESSAGE in info.value.message and info.value.param == "text.format.schema"


# --- Anthropic ---------------------------------------------------------------------------------


def test_anthropic_parse_with_a_pydantic_output_format(claude: anthropic.Anthropic) -> None:
    m = claude.messages.parse(model="m", max_tokens=80, messages=WHERE, output_format=Place)
    assert m.stop_reason == "end_turn" and isinstance(m.parsed_output, Place)


def test_anthropic_tool_choice_any_streams_a_tool_use(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model="m", max_tokens=80, messages=WEATHER_Q, tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"}
    ) as stream:
        m = stream.get_final_message()
    assert m.stop_reason == "tool_use" and m.content
    for block in m.content:
        assert block.type == "tool_use"
        assert_valid_call(block.name, block.input)


def test_anthropic_named_tool_choice(claude: anthropic.Anthropic) -> None:
    m = claude.messages.create(
        model="m",
        max_tokens=80,
        messages=WEATHER_Q,
        tools=ANTHROPIC_TOOLS,
        tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
    )
    (block,) = m.content
    assert m.stop_reason == "tool_use" and block.type == "tool_use" and block.name == "get_time"
    assert_valid_call(block.name, block.input)


def test_anthropic_schema_that_does_not_compile_is_400(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(
            model="m",
            max_tokens=10,
            messages=WHERE,
            stream=True,
            output_config={"format": {"type": "json_schema", "schema": BAD_SCHEMA}},
        )
    assert info.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": BAD_MESSAGE},
    }
