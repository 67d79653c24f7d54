"""POST /api/chat and /api/generate, and the model facts: Ollama's requests to templates and
engine requests, engine events to NDJSON lines, each line read with the ollama client's own types."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ollama import (
    ChatResponse,
    EmbeddingsResponse,
    EmbedResponse,
    GenerateResponse,
    ListResponse,
    ProcessResponse,
    ShowResponse,
)

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.host.client import Embeddings
from mlx_serve.engine.types import (
    EngineTimings,
    Finished,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    TokenLogprob,
    ToolCallArgsDelta,
    ToolCallStart,
    Usage,
)
from mlx_serve.protocols import ollama, ollama_embed, ollama_facts
from mlx_serve.protocols.contract import Frames, Framing, ProtocolContext, Result, ToolCall
from mlx_serve.protocols.ollama_render import OllamaJob
from mlx_serve.server.writer import encode
from tests.protocols.conftest import FakeTokenizer

USER = {"role": "user", "content": "hi"}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIMINGS = EngineTimings(admitted_s=0.01, prefill_chunks=((12, 0.25),), first_token_s=0.3, finished_s=1.3)


def chat(ctx: ProtocolContext, **fields: Any) -> OllamaJob:
    job = ollama.CHAT.parse(orjson.dumps({"model": "m", "messages": [USER], **fields}), ctx)
    assert isinstance(job, OllamaJob)
    return job


def lines(frames: Frames) -> list[dict[str, Any]]:
    """The frames as the writer sends them: one JSON object a line, each line ending in a newline."""
    raw = encode(frames)
    assert raw.endswith(b"\n") and b"\n\n" not in raw
    return [orjson.loads(line) for line in raw.splitlines()]


def test_chat_streams_by_default_in_ndjson(ctx: ProtocolContext) -> None:
    job = chat(ctx)
    assert job.stream and job.framing is Framing.NDJSON and job.chat and job.answer is None
    assert not chat(ctx, stream=False).stream


def test_chat_renders_the_conversation_as_openai_chat_does(
    ctx: ProtocolContext, tokenizer: FakeTokenizer
) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        USER,
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "17 C", "tool_name": "get_weather"},
    ]  # fmt: skip
    job = ollama.CHAT.parse(orjson.dumps({"messages": messages, "tools": [WEATHER]}), ctx)
    call = tokenizer.chat_calls[-1]
    assert call.messages[2]["tool_calls"] == [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ]
    assert call.messages[3] == {"role": "tool", "content": "17 C", "name": "get_weather"}
    assert call.tools == [WEATHER] and job.request.tools == (WEATHER,)
    assert job.request.prompt_tokens == tuple(tokenizer.render_chat(call.messages, call.tools))


def test_options_become_sampling_and_limits(ctx: ProtocolContext) -> None:
    options = {"temperature": 0, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 3, "num_predict": 9,
               "stop": ["\n\n", "END"], "repeat_penalty": 1.2, "repeat_last_n": 32, "presence_penalty": 0.5}  # fmt: skip
    job = chat(ctx, options=options)
    s = job.request.sampling
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (0, 0.5, 7, 0.1, 3)
    assert (s.repetition_penalty, s.repetition_context_size, s.presence_penalty) == (1.2, 32, 0.5)
    assert job.request.max_tokens == 9 and job.request.stop == ("\n\n", "END")
    assert not job.warnings


def test_absent_sampling_options_keep_the_server_defaults(ctx: ProtocolContext) -> None:
    s = chat(ctx, options={"temperature": None}).request.sampling
    assert (s.temperature, s.top_p, s.top_k) == (0.7, 0.9, 40)


def test_num_predict_absent_or_negative_runs_to_the_context(ctx: ProtocolContext) -> None:
    ctx = replace(ctx, context_length=1000)
    prompt = len(chat(ctx).request.prompt_tokens)
    for options in ({}, {"num_predict": -1}, {"num_predict": -2}):
        assert chat(ctx, options=options).request.max_tokens == 1000 - prompt


def test_num_ctx_clamps_prompt_and_answer(ctx: ProtocolContext) -> None:
    prompt = len(chat(ctx).request.prompt_tokens)
    assert chat(ctx, options={"num_ctx": prompt + 5}).request.max_tokens == 5
    assert chat(ctx, options={"num_ctx": prompt + 500, "num_predict": 7}).request.max_tokens == 7
    with pytest.raises(InvalidRequest) as e:
        chat(ctx, options={"num_ctx": prompt})
    assert e.value.param == "options.num_ctx"


@pytest.mark.parametrize(
    ("options", "param"),
    [({"temperature": -1}, "options.temperature"), ({"top_p": 2}, "options.top_p"),
     ({"num_predict": 0}, "options.num_predict"), ({"stop": [""]}, "options.stop[0]"),
     ({"seed": "x"}, "options.seed")],
)  # fmt: skip
def test_bad_options_are_400s_naming_the_option(
    ctx: ProtocolContext, options: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as e:
        chat(ctx, options=options)
    assert e.value.param == param


def test_options_with_no_effect_here_and_keep_alive_are_named_in_warnings(ctx: ProtocolContext) -> None:
    job = chat(ctx, options={"num_gpu": 99, "num_thread": 4, "mirostat": 2, "made_up": 1}, keep_alive="5m")
    assert len(job.warnings) == 2
    assert "num_gpu" in job.warnings[0] and "mirostat" in job.warnings[0] and "made_up" in job.warnings[0]
    assert "keep_alive" in job.warnings[1]


def test_format_json_and_schema_are_grammars(ctx: ProtocolContext) -> None:
    assert chat(ctx).request.grammar is None and chat(ctx, format="").request.grammar is None
    assert chat(ctx, format="json").request.grammar is not None
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert chat(ctx, format=schema).request.grammar is not None
    with pytest.raises(InvalidRequest) as e:
        chat(ctx, format={"type": "no-such-type"})
    assert e.value.param == "format"


def test_think_switches_the_templates_thinking(ctx: ProtocolContext, tokenizer: FakeTokenizer) -> None:
    for think, enabled in ((True, True), (False, False), ("high", True)):
        chat(ctx, think=think)
        assert tokenizer.chat_calls[-1].template_kwargs == {
            **(ctx.defaults.chat_template_args or {}),
            "enable_thinking": enabled,
        }
    chat(ctx)
    assert tokenizer.chat_calls[-1].template_kwargs == ctx.defaults.chat_template_args


def test_images_are_refused_by_name(ctx: ProtocolContext) -> None:
    with pytest.raises(InvalidRequest) as e:
        ollama.CHAT.parse(orjson.dumps({"messages": [{**USER, "images": ["aGk="]}]}), ctx)
    assert e.value.param == "messages[0].images"


def test_model_latest_tag_is_checked_bare_and_echoed_whole(ctx: ProtocolContext) -> None:
    job = chat(ctx, model="smol:latest")
    assert job.model == "smol" and job.echo == "smol:latest"


def test_generate_templates_system_and_prompt_unless_raw(
    ctx: ProtocolContext, tokenizer: FakeTokenizer
) -> None:
    job = ollama.GENERATE.parse(orjson.dumps({"prompt": "hi", "system": "be brief"}), ctx)
    assert tokenizer.chat_calls[-1].messages == [{"role": "system", "content": "be brief"}, USER]
    assert isinstance(job, OllamaJob) and not job.chat
    raw = ollama.GENERATE.parse(orjson.dumps({"prompt": "hi", "raw": True}), ctx)
    assert raw.request.prompt_tokens == tuple(tokenizer.encode("hi"))
    context = ollama.GENERATE.parse(orjson.dumps({"prompt": "hi", "raw": True, "context": [5, 6]}), ctx)
    assert context.request.prompt_tokens == (5, 6, *tokenizer.encode("hi"))


@pytest.mark.parametrize("field", ["suffix", "template", "images"])
def test_generate_refuses_what_it_cannot_honour(ctx: ProtocolContext, field: str) -> None:
    value: Any = ["aGk="] if field == "images" else "x"
    with pytest.raises(InvalidRequest) as e:
        ollama.GENERATE.parse(orjson.dumps({"prompt": "hi", field: value}), ctx)
    assert e.value.param == field


@pytest.mark.parametrize(
    ("fmt", "body"), [(ollama.CHAT, {"model": "m"}), (ollama.GENERATE, {"model": "m", "prompt": ""})]
)
def test_no_prompt_is_a_load_answered_at_once(
    ctx: ProtocolContext, fmt: ollama.OllamaFormat, body: dict[str, Any]
) -> None:
    job = fmt.parse(orjson.dumps(body), ctx)
    assert job.answer is not None
    answer = orjson.loads(job.answer)
    assert answer["done"] is True and answer["done_reason"] == "load" and answer["model"] == "m"
    (ChatResponse if fmt is ollama.CHAT else GenerateResponse).model_validate(answer)


def test_chat_stream_lines_read_as_chat_responses(ctx: ProtocolContext) -> None:
    job = chat(ctx)
    stream = ollama.CHAT.renderer(job, ctx)
    frames = [
        *stream.start(),
        *stream.delta(ReasoningDelta("hmm")),
        *stream.delta(TextDelta("Hel")),
        *stream.delta(TextDelta("lo")),
    ]
    frames += stream.finish(Finished(FinishReason.STOP, Usage(12, 3), timings=TIMINGS))
    out = [ChatResponse.model_validate(line) for line in lines(frames)]
    assert [r.message.thinking for r in out[:1]] == ["hmm"]
    assert "".join(r.message.content or "" for r in out) == "Hello"
    assert [r.done for r in out] == [False, False, False, True]
    last = out[-1]
    assert (last.done_reason, last.prompt_eval_count, last.eval_count) == ("stop", 12, 3)
    assert last.prompt_eval_duration == 250_000_000 and last.eval_duration == 1_000_000_000
    assert last.total_duration is not None and last.total_duration > 0


def test_tool_calls_stream_whole_with_object_arguments(ctx: ProtocolContext) -> None:
    job = chat(ctx, tools=[WEATHER])
    stream = ollama.CHAT.renderer(job, ctx)
    frames = [
        *stream.delta(ToolCallStart(0, "call_1", "get_weather")),
        *stream.delta(ToolCallArgsDelta(0, '{"city": ')),
    ]
    assert frames == []  # held until whole
    frames += stream.delta(ToolCallArgsDelta(0, '"Paris"}'))
    frames += stream.finish(Finished(FinishReason.TOOL_CALLS, Usage(12, 9)))
    out = [ChatResponse.model_validate(line) for line in lines(frames)]
    calls = out[0].message.tool_calls
    assert calls is not None and calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == {"city": "Paris"}
    assert out[-1].done and out[-1].done_reason == "stop"


def test_generate_stream_lines_read_as_generate_responses(ctx: ProtocolContext) -> None:
    job = ollama.GENERATE.parse(orjson.dumps({"prompt": "hi"}), ctx)
    stream = ollama.GENERATE.renderer(job, ctx)
    frames = [*stream.delta(TextDelta("Hi")), *stream.finish(Finished(FinishReason.LENGTH, Usage(3, 1)))]
    out = [GenerateResponse.model_validate(line) for line in lines(frames)]
    assert out[0].response == "Hi" and out[1].done and out[1].done_reason == "length"


def test_heartbeat_is_a_line_with_no_text_and_errors_are_error_lines(ctx: ProtocolContext) -> None:
    stream = ollama.CHAT.renderer(chat(ctx), ctx)
    beat = lines([stream.heartbeat()])[0]
    assert ChatResponse.model_validate(beat).message.content == "" and beat["done"] is False
    assert lines(stream.error(InvalidRequest("boom"))) == [{"error": "boom"}]
    assert orjson.loads(ollama.CHAT.error_body(InvalidRequest("bad", param="x"))) == {"error": "bad"}


def test_whole_answers(ctx: ProtocolContext) -> None:
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    result = Result(
        "", FinishReason.TOOL_CALLS, Usage(10, 4), reasoning="hmm", tool_calls=(call,), timings=TIMINGS
    )
    body = ChatResponse.model_validate_json(ollama.CHAT.to_json(chat(ctx, stream=False), [result], ctx))
    assert body.done and body.message.thinking == "hmm" and body.eval_count == 4
    assert body.message.tool_calls and body.message.tool_calls[0].function.arguments == {"city": "Paris"}
    gen = ollama.GENERATE.parse(orjson.dumps({"prompt": "hi", "stream": False}), ctx)
    text = Result("Hello", FinishReason.STOP, Usage(3, 2))
    whole = GenerateResponse.model_validate_json(ollama.GENERATE.to_json(gen, [text], ctx))
    assert whole.response == "Hello" and whole.done_reason == "stop" and whole.prompt_eval_count == 3


def test_logprobs_when_asked(ctx: ProtocolContext) -> None:
    job = chat(ctx, logprobs=True, top_logprobs=1)
    assert job.request.logprobs == 1
    entry = TokenLogprob("Hi", -0.5, (("Hi", -0.5),))
    line = lines(ollama.CHAT.renderer(job, ctx).delta(TextDelta("Hi", logprobs=(entry,))))[0]
    assert ChatResponse.model_validate(line).logprobs is not None
    assert line["logprobs"] == [
        {"token": "Hi", "logprob": -0.5, "top_logprobs": [{"token": "Hi", "logprob": -0.5}]}
    ]
    assert chat(ctx).request.logprobs is None


Answer = Callable[[bytes, ProtocolContext], tuple[int, bytes]]


def facts(fn: Answer, ctx: ProtocolContext, body: Any = None) -> tuple[int, Any]:
    status, out = fn(b"" if body is None else orjson.dumps(body), ctx)
    return status, orjson.loads(out)


def test_tags_ps_and_version(ctx: ProtocolContext) -> None:
    ctx = replace(ctx, listed=("tiny", "smol:q4"), context_length=8192)
    status, tags = facts(ollama_facts.tags, ctx)
    assert status == 200 and [m.model for m in ListResponse.model_validate(tags).models] == [
        "tiny:latest",
        "smol:q4",
    ]
    status, ps = facts(ollama_facts.ps, ctx)
    assert status == 200 and ProcessResponse.model_validate(ps).models[0].context_length == 8192
    assert facts(ollama_facts.version, ctx)[1]["version"] == ollama_facts.OLLAMA_VERSION


def test_show_answers_served_names_only(ctx: ProtocolContext) -> None:
    ctx = replace(ctx, accepts=lambda name: name == "tiny", context_length=8192)
    status, show = facts(ollama_facts.show, ctx, {"model": "tiny:latest"})
    parsed = ShowResponse.model_validate(show)
    assert status == 200 and parsed.capabilities and "completion" in parsed.capabilities
    assert parsed.modelinfo and parsed.modelinfo[f"{ollama_facts.ARCHITECTURE}.context_length"] == 8192
    assert facts(ollama_facts.show, ctx, {"model": "other"}) == (404, {"error": "model 'other' not found"})
    assert facts(ollama_facts.show, ctx, {})[0] == 400


def test_embed_reads_input_or_prompt_and_answers_in_ollamas_shapes() -> None:
    job = ollama_embed.EMBED.parse(orjson.dumps({"model": "e:latest", "input": ["a", "b"], "dimensions": 2}))
    assert (job.inputs, job.model, job.echo, job.dimensions, job.warnings) == (
        ["a", "b"],
        "e",
        "e:latest",
        2,
        (),
    )
    vectors = Embeddings(np.array([[0.5, 0.25], [1.0, 0.0]], dtype=np.float32), prompt_tokens=4)
    body = orjson.loads(ollama_embed.EMBED.to_json(job, vectors))
    assert body["embeddings"] == [[0.5, 0.25], [1.0, 0.0]] and body["prompt_eval_count"] == 4
    assert EmbedResponse.model_validate(body).model == "e:latest"
    legacy = ollama_embed.EMBEDDINGS.parse(orjson.dumps({"model": "e", "prompt": "a", "keep_alive": 0}))
    assert legacy.inputs == ["a"] and "keep_alive" in legacy.warnings[0]
    assert EmbeddingsResponse.model_validate_json(
        ollama_embed.EMBEDDINGS.to_json(legacy, vectors)
    ).embedding == [0.5, 0.25]


@pytest.mark.parametrize(
    ("fmt", "body", "param"),
    [(ollama_embed.EMBED, {"input": []}, "input"), (ollama_embed.EMBED, {}, "input"),
     (ollama_embed.EMBEDDINGS, {"input": "a"}, "prompt"), (ollama_embed.EMBED, {"input": [1]}, "input[0]")],
)  # fmt: skip
def test_embed_refuses_what_it_cannot_read(
    fmt: ollama_embed.OllamaEmbed, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(InvalidRequest) as e:
        fmt.parse(orjson.dumps(body))
    assert e.value.param == param


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ["model", "messages", "prompt", "options", "format", "tools", "think", "stream", "keep_alive",
          "raw", "system", "context", "logprobs", "top_logprobs", "input"]  # fmt: skip
OPTION_VALUES = st.dictionaries(st.sampled_from(sorted(ollama.Options.__struct_fields__) + ["num_gpu"]), JSON)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.dictionaries(st.sampled_from(FIELDS), JSON | OPTION_VALUES, max_size=6),
    chat=st.booleans(),
)
def test_any_body_is_a_job_or_a_400(ctx: ProtocolContext, body: dict[str, Any], chat: bool) -> None:
    fmt = ollama.CHAT if chat else ollama.GENERATE
    try:
        raw = orjson.dumps(body)
    except orjson.JSONEncodeError:
        return  # not JSON (an int past 64 bits, NaN): nothing a client can send
    try:
        fmt.parse(raw, ctx)
    except InvalidRequest as exc:
        assert exc.status == 400 and exc.message
