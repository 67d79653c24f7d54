"""Tier 2: property-based fuzzing of every POST route (issue 15, item 7).

Hypothesis (a fixed seed: `derandomize`) writes bodies that are mostly almost right: each
route's known fields with plausible or hostile values (huge and negative numbers, wrong types,
deep nesting, odd roles, tools, schemas, chat_template_kwargs), plus raw bytes now and then.
Hostile pools: integers of thousands of digits, float32 edges (denormals, 1e-46), control
characters in every string that reaches a header or a log line, and alternations wider than
llguidance's parser rows; every header value must come back printable ASCII and short.
The app runs with the fake engine and a real Jinja chat template. Every answer must be a 2xx
or 4xx (never 5xx) in the route's own envelope, within a timeout; afterwards the server is
healthy and serves a normal request. A few hundred examples per route, ~1 minute in all.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlx_serve.engine.batch.core import Core
from mlx_serve.server.app import App
from mlx_serve.server.config import Config
from mlx_serve.server.writer import MAX_HEADER_VALUE
from tests.support.asgi import Reply, call
from tests.support.fake_engine import fake_engine

EXAMPLES = int(os.environ.get("MLX_SERVE_FUZZ_EXAMPLES", "250"))  # more for a deeper hunt
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")

numbers = st.one_of(
    st.integers(-3, 3),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, -1, 2**63 - 1, 2**64, 10**12, 0.5, 1.0, 2.0, 1e308]),
    st.sampled_from([10**4000, -(10**4000), 2**1024]),  # huge integers: past int64, float, digit limits
)
# Valid as float64, degenerate as float32 (0, a denormal, or past its range once inverted).
float32_edges = st.sampled_from([1e-39, 5e-324, 1e-46, 1.1754943508222875e-38, 1e-30, 3.4028235e38])
# Client text that reaches a header (Warning) or a log line.
hostile_text = st.sampled_from(
    ["\x1b[31m\r\nx-injected: 1", "\x00", "a\u2028b\u0085c", "\r\n\r\n", "é" * 3000, "\x7f" * 40]
)
# Alternations wider than a parser row holds (llguidance: 2,000 items).
giant_choice = st.just([f"option {i}" for i in range(2500)])
giant_regex = st.just("|".join(f"w{i}" for i in range(3000)))
giant_enum = st.just({"enum": [f"v{i}" for i in range(3000)]})
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=12))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def deep(levels: int) -> Any:
    return json.loads("[" * levels + "]" * levels)


hostile = st.one_of(json_values, st.builds(deep, st.integers(1, 120)))


def either(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(plausible, plausible, plausible, hostile)


schemas = st.one_of(
    st.just({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}),
    st.just({"type": "string", "pattern": "[a-z]+"}),
    st.just({"type": "array", "items": {"type": "integer"}, "maxItems": 2}),
    st.just({"$ref": "#/$defs/x", "$defs": {"x": {"type": "boolean"}}}),
    st.dictionaries(
        st.sampled_from(["type", "properties", "enum", "minLength", "$ref"]), json_values, max_size=3
    ),
    giant_enum,
    st.just({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}),  # a cycle: matches nothing
)
tool = st.fixed_dictionaries(
    {
        "type": st.just("function"),
        "function": st.fixed_dictionaries(
            {"name": either(st.sampled_from(["get", "f", ""]))},
            optional={"parameters": either(schemas), "description": st.text(max_size=20)},
        ),
    }
)
content = st.one_of(
    st.text(max_size=40),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)}), max_size=2),
    hostile,
)
oa_message = st.fixed_dictionaries(
    {
        "role": either(st.sampled_from(["system", "developer", "user", "assistant", "tool"])),
        "content": content,
    },
    optional={
        "name": st.text(max_size=5),
        "tool_call_id": st.text(max_size=5),
        "tool_calls": st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.just("function"),
                    "id": st.text(max_size=4),
                    "function": st.fixed_dictionaries(
                        {"name": st.text(max_size=5), "arguments": either(st.just("{}"))}
                    ),
                }
            ),
            max_size=2,
        ),
    },
)
an_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)}),
    st.fixed_dictionaries(
        {
            "type": st.just("tool_use"),
            "id": st.text(max_size=4),
            "name": st.text(max_size=4),
            "input": json_values,
        }
    ),
    st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": st.text(max_size=4), "content": content}
    ),
    st.fixed_dictionaries(
        {"type": st.just("thinking"), "thinking": st.text(max_size=10), "signature": st.text(max_size=4)}
    ),
    hostile,
)
an_message = st.fixed_dictionaries(
    {
        "role": either(st.sampled_from(["user", "assistant"])),
        "content": st.one_of(st.text(max_size=30), st.lists(an_block, max_size=3)),
    }
)
model = either(st.one_of(st.just("fake-model"), hostile_text))
SAMPLING = {
    "temperature": either(st.one_of(st.floats(0, 2), float32_edges)),
    "top_p": either(st.one_of(st.floats(0, 1), float32_edges)),
    "top_k": either(st.integers(-1, 2000)),
    "min_p": either(st.one_of(st.floats(0, 1), float32_edges)),
    "seed": either(st.integers(-5, 2**64 + 5)),
    "stream": either(st.booleans()),
}
OPENAI = {
    **SAMPLING,
    "model": model,
    "max_tokens": either(st.integers(0, 20)),
    "max_completion_tokens": either(st.integers(0, 20)),
    "n": either(st.integers(0, 18)),
    "stop": either(st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3), hostile_text)),
    "logit_bias": either(
        st.dictionaries(
            st.sampled_from(["1", "2", "999", "1000", "-1", "x", "9" * 5000, "\x1b"]),
            st.one_of(st.floats(-100, 100), float32_edges),
            max_size=2,
        )
    ),
    "logprobs": either(st.one_of(st.booleans(), st.integers(-1, 21))),
    "top_logprobs": either(st.integers(-1, 21)),
    "presence_penalty": either(st.floats(-2, 2)),
    "frequency_penalty": either(st.floats(-2, 2)),
    "repetition_penalty": either(st.floats(0, 3)),
    "repetition_context_size": either(st.integers(0, 2**63)),
    "presence_context_size": either(st.integers(0, 10**13)),
    "frequency_context_size": either(st.integers(0, 10**13)),
    "stream_options": either(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "response_format": either(
        st.one_of(
            st.just({"type": "json_object"}),
            st.builds(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}, schemas),
        )
    ),
    "guided_regex": either(
        st.one_of(st.sampled_from(["[a-z]{1,3}", "(", "a*", "(.{0,1000}){1000}"]), giant_regex)
    ),
    "guided_choice": either(st.one_of(st.lists(st.text(max_size=3), max_size=3), giant_choice)),
    "guided_grammar": either(st.sampled_from(["start: start", 'start: "a" | "b"', "start: ("])),
    "num_draft_tokens": either(st.integers(-1, 20)),
    "prediction": either(
        st.fixed_dictionaries({"type": st.just("content"), "content": st.text(max_size=10)})
    ),
}
CHAT = {
    **OPENAI,
    "tools": either(st.lists(tool, max_size=2)),
    "tool_choice": either(
        st.one_of(
            st.sampled_from(["none", "auto", "required"]),
            st.fixed_dictionaries(
                {
                    "type": st.just("function"),
                    "function": st.fixed_dictionaries({"name": st.sampled_from(["get", "f"])}),
                }
            ),
        )
    ),
    "parallel_tool_calls": either(st.booleans()),
    "reasoning_effort": either(st.sampled_from(["none", "low", "high"])),
    "chat_template_kwargs": either(
        st.dictionaries(
            st.sampled_from(
                [
                    "enable_thinking",
                    "return_tensors",
                    "tokenize",
                    "truncation",
                    "max_length",
                    "padding",
                    "chat_template",
                    "messages",
                    "x",
                ]
            ),
            json_values,
            max_size=3,
        )
    ),
}
MESSAGES = {
    **SAMPLING,
    "system": either(
        st.one_of(
            st.text(max_size=20),
            st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=10)}), max_size=2
            ),
        )
    ),
    "stop_sequences": either(st.lists(st.text(max_size=3), max_size=3)),
    "tools": either(
        st.lists(
            st.one_of(
                st.fixed_dictionaries({"name": st.sampled_from(["get", "f"]), "input_schema": schemas}),
                # hosted tools: their type reaches a Warning header
                st.fixed_dictionaries(
                    {
                        "type": st.one_of(hostile_text, hostile_text.map(lambda t: "web_search_" + t)),
                        "name": st.one_of(st.just("web_search"), hostile_text),
                    }
                ),
            ),
            max_size=2,
        )
    ),
    "tool_choice": either(
        st.one_of(
            st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "none"])}),
            st.fixed_dictionaries({"type": st.just("tool"), "name": st.sampled_from(["get", "f"])}),
        )
    ),
    "thinking": either(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["enabled", "disabled"]), "budget_tokens": st.integers(0, 2000)}
        )
    ),
    "output_format": either(st.builds(lambda s: {"type": "json_schema", "schema": s}, schemas)),
    "metadata": either(st.fixed_dictionaries({"user_id": st.one_of(st.text(max_size=5), hostile_text)})),
}
RESPONSES = {
    **SAMPLING,
    "model": model,
    "instructions": either(st.text(max_size=20)),
    "max_output_tokens": either(st.integers(0, 20)),
    "tools": either(
        st.lists(
            st.fixed_dictionaries(
                {"type": st.just("function"), "name": st.sampled_from(["get", "f"]), "parameters": schemas}
            ),
            max_size=2,
        )
    ),
    "tool_choice": either(st.sampled_from(["none", "auto", "required"])),
    "store": either(st.booleans()),
    "previous_response_id": either(st.sampled_from(["resp_nope", ""])),
    "text": either(
        st.builds(lambda s: {"format": {"type": "json_schema", "name": "x", "schema": s}}, schemas)
    ),
    "reasoning": either(st.fixed_dictionaries({"effort": st.sampled_from(["low", "high", "none"])})),
}
ROUTES: dict[str, tuple[dict[str, st.SearchStrategy[Any]], dict[str, st.SearchStrategy[Any]]]] = {
    "/v1/chat/completions": ({"messages": either(st.lists(oa_message, min_size=1, max_size=3))}, CHAT),
    "/v1/completions": (
        {"prompt": either(st.one_of(st.text(max_size=30), st.lists(st.integers(-2, 1100), max_size=5)))},
        OPENAI,
    ),
    "/v1/messages": (
        {
            "model": model,
            "max_tokens": either(st.integers(0, 20)),
            "messages": either(st.lists(an_message, min_size=1, max_size=3)),
        },
        MESSAGES,
    ),
    "/v1/messages/count_tokens": (
        {
            "model": model,
            "messages": either(st.lists(an_message, min_size=1, max_size=3)),
        },
        MESSAGES,
    ),
    "/v1/responses": (
        {
            "input": either(
                st.one_of(
                    st.text(max_size=30),
                    st.lists(
                        st.fixed_dictionaries(
                            {"role": st.sampled_from(["user", "assistant", "system"]), "content": content}
                        ),
                        max_size=3,
                    ),
                )
            )
        },
        RESPONSES,
    ),
}


def bodies(path: str) -> st.SearchStrategy[bytes]:
    required, optional = ROUTES[path]
    as_json = st.fixed_dictionaries(required, optional=optional).map(lambda b: json.dumps(b).encode())
    raw = st.one_of(st.binary(max_size=40), as_json.map(lambda b: b[: len(b) // 2]))
    return st.one_of(as_json, as_json, as_json, as_json, as_json, raw)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[asyncio.AbstractEventLoop, App]]:
    # The fake runner ignores grammars; the engine's own grammar compile (a real tokenizer's
    # vocabulary) is covered by tests/e2e/test_structured_output.py.
    original = Core._constraint
    Core._constraint = lambda self, request: None  # type: ignore[method-assign, assignment, return-value]
    engine, _ = fake_engine(
        ["a", "b", "<tool_call>", '{"name": "get", "arguments": {}}', "</tool_call>"],
        templated=True,
        context=4096,
        capacity=64,
    )
    loop = asyncio.new_event_loop()
    app = App(Config(max_body_bytes=1 << 20), engine)

    async def start() -> None:
        engine.start()
        await engine.wait_ready()

    loop.run_until_complete(start())
    yield loop, app
    engine.stop()
    loop.close()
    Core._constraint = original  # type: ignore[method-assign]


def check_reply(path: str, reply: Reply) -> None:
    assert 200 <= reply.status < 500, (reply.status, reply.body[:400])
    for name, value in reply.header_list:  # client text in a header: escaped, short
        assert value.isascii() and value.isprintable() and len(value) <= MAX_HEADER_VALUE, (name, value[:80])
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        text = reply.body.decode()
        assert '"server_error"' not in text and '"api_error"' not in text, text[-400:]
        return
    body = json.loads(reply.body)
    if reply.status >= 400:
        error = body["error"]
        assert isinstance(error["message"], str) and error["message"]
        if path in ANTHROPIC:
            assert body["type"] == "error" and isinstance(error["type"], str)
        else:
            assert isinstance(error["type"], str) and "param" in error and "code" in error


def healthy(loop: asyncio.AbstractEventLoop, app: App) -> None:
    health = loop.run_until_complete(call(app, "GET", "/health"))
    ok = loop.run_until_complete(
        call(
            app,
            "POST",
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}',
        )
    )
    assert health.status == 200 and ok.status == 200
    assert app.engine.gate.inflight == 0


@pytest.mark.parametrize("path", list(ROUTES))
def test_fuzzed_bodies_get_no_5xx_and_their_routes_envelope(
    server: tuple[asyncio.AbstractEventLoop, App], path: str
) -> None:
    loop, app = server

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(body=bodies(path))
    def fuzz(body: bytes) -> None:
        check_reply(path, loop.run_until_complete(call(app, "POST", path, body, timeout_s=10)))

    fuzz()
    healthy(loop, app)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
def test_a_non_object_x_guidance_with_a_forced_tool_choice_is_a_400(
    server: tuple[asyncio.AbstractEventLoop, App], path: str
) -> None:
    loop, app = server
    schema = {"type": "object", "x-guidance": "lax"}
    body = {
        "/v1/chat/completions": {
            "messages": [{"role": "user", "content": "hi"}],
            "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
        },
        "/v1/messages": {
            "model": "m",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": schema}],
            "tool_choice": {"type": "any"},
        },
        "/v1/responses": {
            "input": "hi",
            "tool_choice": "required",
            "tools": [{"type": "function", "name": "f", "parameters": schema}],
        },
    }[path]
    reply = loop.run_until_complete(call(app, "POST", path, json.dumps(body).encode()))
    assert reply.status == 400
