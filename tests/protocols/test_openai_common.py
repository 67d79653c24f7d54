"""Fields and errors both OpenAI formats share, checked through each format's parse()."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import orjson
import pytest

from mlx_serve.engine.errors import (
    ContextTooLong,
    EngineFailed,
    EngineUnavailable,
    InvalidRequest,
    QueueFull,
    ServeError,
)
from mlx_serve.engine.types import SamplingParams
from mlx_serve.protocols import openai_chat, openai_common, openai_completions, openai_render, structured
from mlx_serve.protocols.contract import (
    Job,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ProtocolContext,
    Unauthorized,
    WireFormat,
)

Body = dict[str, Any]

CHAT_BASE: Body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
COMPLETION_BASE: Body = {"model": "m", "prompt": "hi"}
FORMATS: list[tuple[WireFormat, Body]] = [
    (openai_chat.FORMAT, CHAT_BASE),
    (openai_completions.FORMAT, COMPLETION_BASE),
]


@pytest.fixture(params=FORMATS, ids=["chat", "completions"])
def fmt(request: pytest.FixtureRequest, ctx: ProtocolContext) -> Callable[..., Job]:
    """parse() of one format with its minimal body plus the given fields."""
    wire: WireFormat = request.param[0]
    base: Body = request.param[1]

    def parse(**fields: Any) -> Job:
        return wire.parse(orjson.dumps({**base, **fields}), ctx)

    return parse


def parse_error(parse: Callable[..., Job], **fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse(**fields)
    assert info.value.status == 400
    return info.value


# --- error envelope ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "status", "kind", "code"),
    [
        (InvalidRequest("bad"), 400, "invalid_request_error", None),
        (ContextTooLong("long"), 400, "invalid_request_error", "context_length_exceeded"),
        (NotFound("no model"), 404, "invalid_request_error", None),
        (MethodNotAllowed("GET"), 405, "invalid_request_error", None),
        (PayloadTooLarge("big"), 413, "invalid_request_error", None),
        (Unauthorized("key"), 401, "invalid_request_error", "invalid_api_key"),
        (QueueFull("busy"), 429, "requests", "rate_limit_exceeded"),
        (EngineUnavailable("loading"), 503, "server_error", None),
        (EngineFailed("oom"), 500, "server_error", None),
        (ServeError("?"), 500, "server_error", None),
    ],
)
def test_error_body_maps_each_error_class(exc: ServeError, status: int, kind: str, code: str | None) -> None:
    for wire, _ in FORMATS:
        body = orjson.loads(wire.error_body(exc))
        error = {"message": exc.message, "type": kind, "param": None, "code": code}
        assert body == {"error": error}
    assert exc.status == status


def test_error_body_carries_param() -> None:
    body = orjson.loads(openai_render.error_body(InvalidRequest("no", param="messages[0].role")))
    assert body["error"]["param"] == "messages[0].role"


def test_error_body_fills_sdk_error_fields() -> None:
    body = orjson.loads(openai_render.error_body(ContextTooLong("too long", param="messages")))
    # the SDK's own HTTP client builds the request (httpx before openai 3, httpx2 after)
    sdk = openai.OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1", max_retries=0)
    request = sdk._client.build_request("POST", "http://127.0.0.1:9/v1/chat/completions")
    err = openai.APIError("too long", request=request, body=body["error"])
    assert (err.type, err.code, err.param) == ("invalid_request_error", "context_length_exceeded", "messages")


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ("Expected `int`, got `str` - at `$.max_tokens`", "max_tokens"),
        ("Invalid enum value 'bot' - at `$.messages[0].role`", "messages[0].role"),
        ("Object missing required field `messages`", "messages"),
        ("Object missing required field `role` - at `$.messages[2]`", "messages[2].role"),
        ("Expected `object`, got `array`", None),
    ],
)
def test_error_param_reads_msgspec_paths(message: str, param: str | None) -> None:
    assert openai_common.error_param(message) == param


# --- decoding ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("wire", "_base"), FORMATS, ids=["chat", "completions"])
@pytest.mark.parametrize("raw", [b"", b"{", b'{"model": }', b"\xff\xfe", b'{"model": "m",}'])
def test_parse_rejects_malformed_json(
    wire: WireFormat, _base: Body, raw: bytes, ctx: ProtocolContext
) -> None:
    with pytest.raises(InvalidRequest) as info:
        wire.parse(raw, ctx)
    assert info.value.message.startswith("could not parse JSON body: ")
    assert info.value.param is None


@pytest.mark.parametrize(("wire", "_base"), FORMATS, ids=["chat", "completions"])
@pytest.mark.parametrize("raw", [b"[]", b"null", b'"hi"', b"3"])
def test_parse_rejects_non_object_body(
    wire: WireFormat, _base: Body, raw: bytes, ctx: ProtocolContext
) -> None:
    with pytest.raises(InvalidRequest) as info:
        wire.parse(raw, ctx)
    assert "Expected `object`" in info.value.message


@pytest.mark.parametrize(
    ("field", "value", "param"),
    [
        ("model", 3, "model"),
        ("stream", "yes", "stream"),
        ("stream_options", {"include_usage": "yes"}, "stream_options.include_usage"),
        ("max_tokens", 0, "max_tokens"),
        ("max_tokens", -5, "max_tokens"),
        ("max_tokens", 1.5, "max_tokens"),
        ("max_tokens", "10", "max_tokens"),
        ("max_completion_tokens", 0, "max_completion_tokens"),
        ("temperature", -0.1, "temperature"),
        ("temperature", 2.5, "temperature"),
        ("temperature", "hot", "temperature"),
        ("top_p", 1.1, "top_p"),
        ("top_p", -0.1, "top_p"),
        ("top_k", -2, "top_k"),
        ("top_k", 1.5, "top_k"),
        ("min_p", 1.5, "min_p"),
        ("repetition_penalty", -1, "repetition_penalty"),
        ("repetition_context_size", -1, "repetition_context_size"),
        ("presence_penalty", 2.5, "presence_penalty"),
        ("frequency_penalty", -3, "frequency_penalty"),
        ("presence_context_size", -1, "presence_context_size"),
        ("frequency_context_size", "x", "frequency_context_size"),
        ("logit_bias", {"5": 101}, "logit_bias[...]"),
        ("logit_bias", [1, 2], "logit_bias"),
        ("stop", 5, "stop"),
        ("stop", [""], "stop[0]"),
        ("stop", ["a", 1], "stop[1]"),
        ("stop", ["s"] * 17, "stop"),
        ("seed", 1.5, "seed"),
        ("n", 0, "n"),
        ("n", 17, "n"),
        ("response_format", {"schema": {}}, "response_format.type"),
        ("response_format", {"type": "xml"}, "response_format.type"),
        ("guided_choice", "red", "guided_choice"),
    ],
)
def test_parse_rejects_invalid_fields(fmt: Callable[..., Job], field: str, value: Any, param: str) -> None:
    err = parse_error(fmt, **{field: value})
    assert err.param == param
    assert f"`$.{param}`" in err.message or "missing required field" in err.message


# --- structured output ---------------------------------------------------------------------------

SCHEMA: Body = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("fields", "grammar"),
    [
        ({"response_format": {"type": "json_object"}}, structured.json_schema(None, "p")),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True},
                }
            },
            structured.json_schema(SCHEMA, "p"),
        ),
        ({"guided_json": SCHEMA}, structured.json_schema(SCHEMA, "p")),
        ({"guided_json": orjson.dumps(SCHEMA).decode()}, structured.json_schema(SCHEMA, "p")),
        ({"guided_regex": "[a-z]+"}, structured.regex("[a-z]+", "p")),
        ({"guided_choice": ["yes", "no"]}, structured.choice(["yes", "no"], "p")),
        ({"guided_grammar": 'start: "x"'}, structured.grammar('start: "x"', "p")),
        ({"structured_outputs": {"json": SCHEMA}}, structured.json_schema(SCHEMA, "p")),
        ({"structured_outputs": {"regex": "[a-z]+"}}, structured.regex("[a-z]+", "p")),
        ({"structured_outputs": {"choice": ["a"]}}, structured.choice(["a"], "p")),
        ({"structured_outputs": {"grammar": 'root ::= "x"'}}, structured.grammar('root ::= "x"', "p")),
        ({"structured_outputs": {"json_object": True}}, structured.json_schema(None, "p")),
        ({"response_format": {"type": "text"}}, None),
        # llama.cpp's fields: a GBNF grammar, a JSON schema.
        ({"grammar": 'root ::= "yes" | "no"'}, structured.grammar('root ::= "yes" | "no"', "p")),
        ({"json_schema": SCHEMA}, structured.json_schema(SCHEMA, "p")),
    ],
)
def test_parse_turns_structured_output_fields_into_a_grammar(
    fmt: Callable[..., Job], fields: Body, grammar: str | None
) -> None:
    request = fmt(**fields).request
    assert request.grammar == grammar and not request.forced_tool_calls


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "foo"}},
                }
            },
            "response_format.json_schema.schema",
            "invalid JSON schema: Invalid type: foo",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "needs `json_schema`"),
        ({"guided_json": "{not json"}, "guided_json", "invalid JSON schema: not JSON"),
        ({"guided_regex": "a[b"}, "guided_regex", "unclosed character class"),
        ({"guided_choice": []}, "guided_choice", "a choice needs a non-empty list of strings"),
        ({"guided_grammar": "start: nothing_here"}, "guided_grammar", 'unknown name: "nothing_here"'),
        ({"structured_outputs": {"regex": "(x"}}, "structured_outputs.regex", "invalid regex"),
        ({"grammar": "root ::= undefined_rule"}, "grammar", "invalid grammar"),
        ({"json_schema": {"type": "foo"}}, "json_schema", "invalid JSON schema"),
        ({"grammar": 'root ::= "x"', "json_schema": SCHEMA}, "json_schema", "both constrain the answer"),
        (
            {"guided_regex": "x", "guided_choice": ["x"]},
            "guided_choice",
            "`guided_regex` and `guided_choice` both constrain the answer; give one",
        ),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"json": {}}},
            "structured_outputs.json",
            "both constrain the answer",
        ),
        (
            {"structured_outputs": {"structural_tag": {"structures": []}}},
            "structured_outputs.structural_tag",
            "is not supported yet",
        ),
    ],
)
def test_parse_rejects_a_grammar_that_does_not_compile(
    fmt: Callable[..., Job], fields: Body, param: str, says: str
) -> None:
    err = parse_error(fmt, **fields)
    assert err.param == param and says in err.message


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("xtc_probability", 0.5, "`xtc_probability` > 0 is not supported yet"),
        ("draft_model", "some/draft", "`draft_model` is not supported yet"),
    ],
)
def test_parse_rejects_unsupported_fields(
    fmt: Callable[..., Job], field: str, value: Any, message: str
) -> None:
    err = parse_error(fmt, **{field: value})
    assert (err.param, err.message) == (field, message)


@pytest.mark.parametrize(
    "fields",
    [
        {"n": 1},
        {"n": None},
        {"logprobs": False},
        {"top_logprobs": 0},
        {"top_logprobs": -1},
        {"response_format": {"type": "text"}},
        {"prediction": None},
        {"xtc_probability": 0.0, "xtc_threshold": 0.1},
        {"adapters": None},
        {"draft_model": "default_model"},
    ],
)
def test_parse_accepts_unsupported_fields_at_neutral_values(fmt: Callable[..., Job], fields: Body) -> None:
    assert fmt(**fields).request.prompt_tokens


def test_parse_ignores_harmless_extra_fields(fmt: Callable[..., Job]) -> None:
    job = fmt(
        user="u-1",
        metadata={"a": "b"},
        store=False,
        service_tier="auto",
        parallel_tool_calls=True,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
        something_new={"nested": [1, 2]},
    )
    assert job.stream and job.include_usage


# --- resolved request ------------------------------------------------------------------------


def test_sampling_falls_back_to_server_defaults(fmt: Callable[..., Job]) -> None:
    job = fmt()
    assert job.request.sampling == SamplingParams(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05)
    assert job.request.max_tokens == 256
    assert job.request.stop == ()
    assert (job.stream, job.include_usage) == (False, False)


def test_sampling_takes_request_fields(fmt: Callable[..., Job]) -> None:
    job = fmt(
        temperature=0,
        top_p=0.5,
        top_k=5,
        min_p=0.1,
        repetition_penalty=1.1,
        repetition_context_size=64,
        presence_penalty=0.5,
        presence_context_size=30,
        frequency_penalty=-0.5,
        frequency_context_size=40,
        seed=7,
        max_tokens=9,
    )
    assert job.request.sampling == SamplingParams(
        temperature=0.0,
        top_p=0.5,
        top_k=5,
        min_p=0.1,
        repetition_penalty=1.1,
        repetition_context_size=64,
        presence_penalty=0.5,
        presence_context_size=30,
        frequency_penalty=-0.5,
        frequency_context_size=40,
        seed=7,
    )
    assert job.request.max_tokens == 9


def test_sampling_nulls_mean_server_defaults(fmt: Callable[..., Job]) -> None:
    job = fmt(temperature=None, top_p=None, top_k=None, max_tokens=None, stop=None, seed=None)
    assert job.request.sampling.temperature == 0.7
    assert job.request.max_tokens == 256


def test_sampling_normalises_mlx_lm_off_values(fmt: Callable[..., Job]) -> None:
    sampling = fmt(top_p=0, top_k=-1).request.sampling
    assert (sampling.top_p, sampling.top_k) == (1.0, 0)


def test_max_completion_tokens_wins_over_max_tokens(fmt: Callable[..., Job]) -> None:
    assert fmt(max_tokens=10, max_completion_tokens=20).request.max_tokens == 20
    assert fmt(max_tokens=10, max_completion_tokens=None).request.max_tokens == 10


def test_logit_bias_keys_become_token_ids(fmt: Callable[..., Job]) -> None:
    job = fmt(logit_bias={"5": -100, "999": 2.5, "0": 0})
    assert job.request.sampling.logit_bias == {5: -100.0, 999: 2.5, 0: 0.0}
    assert fmt(logit_bias={}).request.sampling.logit_bias is None


@pytest.mark.parametrize("key", ["1000", "-1", "abc", "1.5", ""])
def test_logit_bias_rejects_keys_outside_vocab(fmt: Callable[..., Job], key: str) -> None:
    err = parse_error(fmt, logit_bias={key: 1})
    assert err.param == f"logit_bias.{key}"
    assert "not a token id" in err.message


@pytest.mark.parametrize(
    ("stop", "expected"),
    [("END", ("END",)), (["a", "b"], ("a", "b")), ([], ()), (None, ()), (["x"] * 16, ("x",) * 16)],
)
def test_stop_accepts_string_or_list(fmt: Callable[..., Job], stop: Any, expected: tuple[str, ...]) -> None:
    assert fmt(stop=stop).request.stop == expected


def test_include_usage_only_when_streaming(fmt: Callable[..., Job]) -> None:
    assert fmt(stream=True, stream_options={"include_usage": True}).include_usage
    assert not fmt(stream=False, stream_options={"include_usage": True}).include_usage
    assert not fmt(stream=True, stream_options={"include_usage": False}).include_usage
    assert not fmt(stream=True, stream_options=None).include_usage


def test_model_defaults_to_served_model(fmt: Callable[..., Job], ctx: ProtocolContext) -> None:
    assert fmt(model=None).model == ctx.model_id
    assert fmt(model="client-name").model == "client-name"


def test_request_ids_are_unique_and_prefixed(ctx: ProtocolContext) -> None:
    chat = {openai_chat.FORMAT.parse(orjson.dumps(CHAT_BASE), ctx).request.id for _ in range(3)}
    text = {openai_completions.FORMAT.parse(orjson.dumps(COMPLETION_BASE), ctx).request.id for _ in range(3)}
    assert len(chat) == len(text) == 3
    assert all(i.startswith("chatcmpl-") and len(i) == 9 + 32 for i in chat)
    assert all(i.startswith("cmpl-") and len(i) == 5 + 32 for i in text)


def test_system_fingerprint_is_stable_per_model() -> None:
    fp = openai_render.system_fingerprint("a/b")
    assert fp == openai_render.system_fingerprint("a/b") != openai_render.system_fingerprint("a/c")
    assert fp.startswith("fp_") and len(fp) == 13


# --- speculative decoding fields -------------------------------------------------------------


def test_prediction_and_num_draft_tokens_reach_the_engine_request(fmt: Callable[..., Job]) -> None:
    job = fmt(prediction={"type": "content", "content": "abc"}, num_draft_tokens=2)
    assert job.request.prediction == tuple(ord(c) for c in "abc")
    assert job.request.num_draft_tokens == 2
    parts = fmt(
        prediction={
            "type": "content",
            "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "c"}],
        }
    )
    assert parts.request.prediction == job.request.prediction
    assert fmt(num_draft_tokens=0).request.num_draft_tokens == 0
    plain = fmt().request
    assert (plain.prediction, plain.num_draft_tokens) == (None, None)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prediction": {"type": "text", "content": "x"}}, "prediction.type"),
        ({"prediction": "just a string"}, "prediction.type"),
        ({"prediction": {"type": "content", "content": 5}}, "prediction.content"),
        ({"prediction": {"type": "content", "content": [{"type": "image_url"}]}}, "prediction.content"),
        ({"num_draft_tokens": -1}, "num_draft_tokens"),
        ({"num_draft_tokens": 17}, "num_draft_tokens"),
    ],
)
def test_bad_speculation_fields_are_400s_naming_the_field(
    fmt: Callable[..., Job], fields: Body, param: str
) -> None:
    assert parse_error(fmt, **fields).param == param
