"""Real tier: the default model behind a real Hypercorn. A structured-output grammar the model
cannot follow is a 400 naming the field before any stream starts, never an empty `stop`."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.server_proc import ServerProcess

USER = [{"role": "user", "content": "Pick one."}]
CYCLE = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}
REFUSED = {
    "lark-start-start": ({"guided_grammar": "start: start"}, "guided_grammar"),
    "json-schema-ref-cycle": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": CYCLE}}},
        "response_format",
    ),
    "regex-past-lexer-limits": ({"guided_regex": "(.{0,1000}){1000}"}, "guided_regex"),
    "choice-of-20k": ({"guided_choice": [f"option {i}" for i in range(20_000)]}, "guided_choice"),
    "choice-of-100k": ({"guided_choice": [f"option {i}" for i in range(100_000)]}, "guided_choice"),
}


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(("fields", "param"), REFUSED.values(), ids=REFUSED.keys())
def test_unfollowable_grammar_is_a_400_before_any_stream(
    smollm_server: ServerProcess, fields: dict[str, Any], param: str, stream: bool
) -> None:
    body = {"messages": USER, "max_tokens": 8, "stream": stream, **fields}
    reply = httpx.post(smollm_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 400, reply.text[:500]
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] in (param, "response_format")
    assert "<state>" not in error["message"] and len(error["message"]) < 500


def test_a_followable_choice_still_answers_one_of_its_options(smollm_server: ServerProcess) -> None:
    options = [f"option {i}" for i in range(500)]
    body = {"messages": USER, "max_tokens": 16, "guided_choice": options}
    reply = httpx.post(smollm_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text[:500]
    choice = reply.json()["choices"][0]
    assert choice["message"]["content"] in options and choice["finish_reason"] == "stop"
