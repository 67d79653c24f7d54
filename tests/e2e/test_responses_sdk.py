"""Tier 3: the openai SDK's Responses API against a real Hypercorn serving the real default model.

Every answer is compared with the chat endpoint's for the same conversation: the same greedy
text and the same usage (input_tokens is the chat endpoint's prompt_tokens).
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support.server_proc import ServerProcess, assert_disconnect_stops_generation

QUESTION = "What is the capital of France?"
STORY = "Write a very long story about a dragon who learns to cook."
SYSTEM = "You are a geography teacher. Answer in one sentence."
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": False,
}
CHAT_WEATHER: Any = {
    "type": "function",
    "function": {
        "name": WEATHER["name"],
        "description": WEATHER["description"],
        "parameters": WEATHER["parameters"],
    },
}


@pytest.fixture(scope="module")
def client(smollm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0)


def chat_answer(client: openai.OpenAI, messages: Any, max_tokens: int, **fields: Any) -> tuple[str, int, int]:
    c = client.chat.completions.create(model="m", messages=messages, max_tokens=max_tokens, **fields)
    assert c.usage is not None
    return c.choices[0].message.content or "", c.usage.prompt_tokens, c.usage.completion_tokens


def usage_of(r: openai.types.responses.Response) -> tuple[int, int]:
    assert r.usage is not None
    return r.usage.input_tokens, r.usage.output_tokens


def test_create_matches_the_chat_endpoint(client: openai.OpenAI) -> None:
    r = client.responses.create(model="m", input=QUESTION, max_output_tokens=30)
    text, prompt, completion = chat_answer(client, [{"role": "user", "content": QUESTION}], 30)
    assert "Paris" in r.output_text and r.output_text == text
    assert r.status == "completed" and r.id.startswith("resp_") and r.object == "response"
    assert [i.type for i in r.output] == ["message"] and r.output[0].id.startswith("msg_")
    assert usage_of(r) == (prompt, completion)
    assert r.usage is not None and r.usage.total_tokens == prompt + completion


def test_instructions_and_items_match_chat(client: openai.OpenAI) -> None:
    turns: Any = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": [{"type": "input_text", "text": "And of Italy?"}]},
    ]
    r = client.responses.create(model="m", instructions=SYSTEM, input=turns, max_output_tokens=20)
    text, prompt, _ = chat_answer(
        client,
        [{"role": "system", "content": SYSTEM}, *turns[:2], {"role": "user", "content": "And of Italy?"}],
        20,
    )
    assert r.output_text == text and usage_of(r)[0] == prompt
    dev = client.responses.create(
        model="m", max_output_tokens=20, input=[{"role": "developer", "content": SYSTEM}, *turns]
    )
    assert usage_of(dev)[0] == prompt


def test_stream_final_response_equals_create(client: openai.OpenAI) -> None:
    whole = client.responses.create(model="m", input=QUESTION, max_output_tokens=30)
    with client.responses.stream(model="m", input=QUESTION, max_output_tokens=30) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == whole.output_text and usage_of(final) == usage_of(whole)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI) -> None:
    r = client.responses.create(model="m", input=STORY, max_output_tokens=16)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens" and usage_of(r)[1] == 16
    with client.responses.stream(model="m", input=STORY, max_output_tokens=16) as stream:
        last = list(stream)[-1]
    assert last.type == "response.incomplete" and last.response.output_text == r.output_text


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(model="m", input="My name is Ada. Say hello to me.", max_output_tokens=20)
    second = client.responses.create(
        model="m", previous_response_id=first.id, input="What is my name?", max_output_tokens=20
    )
    text, prompt, _ = chat_answer(
        client,
        [
            {"role": "user", "content": "My name is Ada. Say hello to me."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "What is my name?"},
        ],
        20,
    )
    assert second.previous_response_id == first.id
    assert second.output_text == text and usage_of(second)[0] == prompt


def test_retrieve_delete_and_unknown_ids(client: openai.OpenAI) -> None:
    made = client.responses.create(model="m", input=QUESTION, max_output_tokens=10)
    got = client.responses.retrieve(made.id)
    assert got.model_dump(exclude={"completed_at"}) == made.model_dump(exclude={"completed_at"})
    client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(made.id)
    assert e.value.body == {
        "message": f"Response with id '{made.id}' not found.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model="m", input="hi", previous_response_id="resp_unknown")
    assert e.value.param == "previous_response_id"
    unstored = client.responses.create(model="m", input=QUESTION, max_output_tokens=5, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_function_call_round_trip_in_the_input_matches_chat(client: openai.OpenAI) -> None:
    ask = {"role": "user", "content": "What is the weather in Paris? Use the tool."}
    r = client.responses.create(
        model="m",
        tools=[WEATHER],
        max_output_tokens=30,
        input=[
            ask,
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 24 C"},
        ],
    )
    text, prompt, _ = chat_answer(
        client,
        [
            ask,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 C"},
        ],
        30,
        tools=[CHAT_WEATHER],
    )
    assert usage_of(r)[0] == prompt and r.output_text == text


def test_tool_prompt_answers_in_the_wire_shape(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model="m",
        tools=[WEATHER],
        tool_choice="auto",
        input="Call get_weather for Paris.",
        max_output_tokens=60,
    )
    assert r.status in ("completed", "incomplete")
    assert {i.type for i in r.output} <= {"message", "function_call", "reasoning"}
    for item in r.output:
        if item.type == "function_call":
            assert item.id is not None and item.id.startswith("fc_") and item.call_id


def test_errors_use_openai_envelope(client: openai.OpenAI, smollm_server: ServerProcess) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(
            model="m",
            input="hi",
            text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "foo"}}},
        )
    assert e.value.param == "text.format.schema" and "Invalid type: foo" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(
            model="m",
            input=[
                {
                    "role": "user",
                    "content": [
                        {"type": "input_image", "image_url": "http://example.com/cat.png", "detail": "auto"}
                    ],
                }
            ],
        )
    assert e.value.message.endswith("this model has no vision input")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input="hi", temperature=5)
    assert e.value.param == "temperature"
    url = smollm_server.url + "/v1/responses"
    for body in (b"{", b'{"model": "m"}', b'{"input": [{"role": "robot", "content": "x"}]}'):
        r = httpx.post(url, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, body
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert client.responses.create(model="m", input="hi", max_output_tokens=5).output


def test_disconnect_mid_stream_stops_generation(smollm_server: ServerProcess) -> None:
    body = {"model": "m", "input": STORY, "max_output_tokens": 2000, "stream": True}
    assert_disconnect_stops_generation(smollm_server, "/v1/responses", body, 16)
