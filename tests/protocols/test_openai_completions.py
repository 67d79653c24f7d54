"""POST /v1/completions: prompt forms, results and events to OpenAI's text_completion shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson
import pytest
from openai.types import Completion

from mlx_serve.engine.errors import InvalidRequest, QueueFull
from mlx_serve.engine.types import Finished, FinishReason, TextDelta, Usage
from mlx_serve.protocols import openai_completions
from mlx_serve.protocols.contract import KEEP_ALIVE, Frames, Job, ProtocolContext, Result, WireFormat

FORMAT: WireFormat = openai_completions.FORMAT
Split = Callable[[Frames], list[Any]]


def parse(ctx: ProtocolContext, **fields: Any) -> Job:
    return FORMAT.parse(orjson.dumps({"model": "m", **fields}), ctx)


def parse_error(ctx: ProtocolContext, **fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        parse(ctx, **fields)
    assert info.value.status == 400
    return info.value


def sdk_chunk(frame: dict[str, Any]) -> Completion:
    # OpenAI streams `finish_reason: null` until the end, but the SDK's type (shared with the
    # non-streamed object) lists no null; the SDK builds stream chunks without validating.
    choices = [{**c, "finish_reason": c["finish_reason"] or "stop"} for c in frame["choices"]]
    return Completion.model_validate({**frame, "choices": choices})


# --- parse ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "tokens"),
    [
        ("abc", (97, 98, 99)),
        (["abc"], (97, 98, 99)),
        ([5, 6, 7], (5, 6, 7)),
        ([[5, 6, 7]], (5, 6, 7)),
        ([0], (0,)),
        ([999], (999,)),
    ],
)
def test_parse_accepts_prompt_forms(ctx: ProtocolContext, prompt: Any, tokens: tuple[int, ...]) -> None:
    job = parse(ctx, prompt=prompt)
    assert job.request.prompt_tokens == tokens
    assert job.request.id.startswith("cmpl-")


def test_parse_does_not_apply_chat_template(ctx: ProtocolContext) -> None:
    parse(ctx, prompt="hello")
    assert ctx.tokenizer.chat_calls == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("prompt", "message", "param"),
    [
        ("", "`prompt` is empty", "prompt"),
        ([], "`prompt` is empty", "prompt"),
        ([""], "`prompt[0]` is empty", "prompt[0]"),
        ([[]], "`prompt[0]` is empty", "prompt[0]"),
        (["a", ""], "`prompt[1]` is empty", "prompt[1]"),
        ([1, "a"], "`prompt` mixes token ids with other prompts", "prompt"),
        ([1000], "token id 1000 at prompt[0] is not in this model's vocabulary (0..999)", "prompt"),
        ([1, -1], "token id -1 at prompt[1] is not in this model's vocabulary (0..999)", "prompt"),
        (
            [[3], [3, 1000]],
            "token id 1000 at prompt[1][1] is not in this model's vocabulary (0..999)",
            "prompt[1]",
        ),
    ],
)
def test_parse_rejects_bad_prompts(ctx: ProtocolContext, prompt: Any, message: str, param: str) -> None:
    err = parse_error(ctx, prompt=prompt)
    assert (err.message, err.param) == (message, param)


def test_parse_takes_several_prompts_n_choices_each(ctx: ProtocolContext) -> None:
    job = parse(ctx, prompt=["ab", [5, 6], "c"], n=2)
    assert job.request.prompt_tokens == (97, 98)
    assert job.prompts == ((5, 6), (99,))
    assert (job.n, job.choices) == (2, 6)


def test_parse_caps_prompts_times_n(ctx: ProtocolContext) -> None:
    err = parse_error(ctx, prompt=["a"] * 65, n=2)
    assert err.param == "prompt" and "over the 128 choices" in err.message


def test_to_json_several_prompts_count_each_prompt_once(ctx: ProtocolContext) -> None:
    job = parse(ctx, prompt=["ab", "cde"], n=2)
    results = [
        Result(f"t{i}", FinishReason.STOP, Usage(2 if i < 2 else 3, 1, cached_tokens=1 if i < 2 else 0))
        for i in range(4)
    ]
    body = orjson.loads(FORMAT.to_json(job, results, ctx))
    Completion.model_validate(body)
    assert [(c["index"], c["text"]) for c in body["choices"]] == [(0, "t0"), (1, "t1"), (2, "t2"), (3, "t3")]
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (5, 4, 9)
    assert usage["prompt_tokens_details"] == {"cached_tokens": 1}


def test_stream_several_prompts_end_after_every_choice(ctx: ProtocolContext, sse_frames: Split) -> None:
    job = parse(ctx, prompt=["ab", "cde"], stream=True, stream_options={"include_usage": True})
    stream = FORMAT.renderer(job, ctx)
    out = stream.start()
    out += stream.delta(TextDelta("y"), 1)
    out += stream.finish(Finished(FinishReason.STOP, Usage(3, 1)), 1)
    assert "[DONE]" not in sse_frames(out)
    out += stream.delta(TextDelta("x"), 0)
    out += stream.finish(Finished(FinishReason.LENGTH, Usage(2, 1)), 0)
    frames = sse_frames(out)
    assert frames[-1] == "[DONE]"
    assert [c["index"] for f in frames[:-2] for c in f["choices"]] == [1, 1, 0, 0]
    assert frames[-2]["usage"]["prompt_tokens"] == 5


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"prompt": [1.5]}, "prompt[0]"),
        ({"prompt": [[1, "a"]]}, "prompt[0][1]"),
        ({"prompt": "x", "echo": "yes"}, "echo"),
        ({"prompt": "x", "best_of": "2"}, "best_of"),
    ],
)
def test_parse_rejects_malformed_fields(ctx: ProtocolContext, fields: dict[str, Any], param: str) -> None:
    assert parse_error(ctx, **fields).param == param


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("best_of", 3, "`best_of` > 1 is not supported yet"),
        ("echo", True, "`echo` is not supported yet"),
        ("suffix", "tail", "`suffix` is not supported yet"),
    ],
)
def test_parse_rejects_unsupported_completion_fields(
    ctx: ProtocolContext, field: str, value: Any, message: str
) -> None:
    err = parse_error(ctx, prompt="x", **{field: value})
    assert (err.param, err.message) == (field, message)


def test_parse_accepts_completion_fields_at_neutral_values(ctx: ProtocolContext) -> None:
    job = parse(ctx, prompt="x", best_of=1, echo=False, suffix=None, logprobs=None)
    assert job.request.prompt_tokens == (120,)
    assert parse(ctx, prompt="x", suffix="").request.prompt_tokens == (120,)


# --- JSON answer --------------------------------------------------------------------------------


def test_to_json_matches_openai_shape(ctx: ProtocolContext) -> None:
    job = parse(ctx, prompt="Once")
    body = orjson.loads(FORMAT.to_json(job, [Result(" upon", FinishReason.LENGTH, Usage(4, 2))], ctx))
    assert body == {
        "id": job.request.id,
        "object": "text_completion",
        "created": 1_700_000_000,
        "model": "m",
        "system_fingerprint": body["system_fingerprint"],
        "choices": [{"text": " upon", "index": 0, "logprobs": None, "finish_reason": "length"}],
        "usage": {
            "prompt_tokens": 4,
            "completion_tokens": 2,
            "total_tokens": 6,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        },
    }
    sdk = Completion.model_validate(body)
    assert (sdk.choices[0].text, sdk.choices[0].finish_reason) == (" upon", "length")
    assert sdk.usage is not None and sdk.usage.total_tokens == 6


# --- streaming ------------------------------------------------------------------------------


def run_stream(job: Job, ctx: ProtocolContext, texts: list[str]) -> Frames:
    renderer = FORMAT.renderer(job, ctx)
    out = renderer.start()
    for text in texts:
        out += renderer.delta(TextDelta(text))
    return out + renderer.finish(Finished(FinishReason.STOP, Usage(3, len(texts)), "\n"))


def test_stream_frames_match_openai_sequence(ctx: ProtocolContext, sse_frames: Split) -> None:
    job = parse(ctx, prompt="Once", stream=True)
    assert FORMAT.renderer(job, ctx).start() == []
    frames = sse_frames(run_stream(job, ctx, [" upon", " a"]))
    head = {
        "id": job.request.id,
        "object": "text_completion",
        "created": 1_700_000_000,
        "model": "m",
        "system_fingerprint": frames[0]["system_fingerprint"],
    }

    def chunk(text: str, finish: str | None = None) -> dict[str, Any]:
        return {**head, "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

    assert frames == [chunk(" upon"), chunk(" a"), chunk("", "stop"), "[DONE]"]
    for frame in frames[:-1]:
        sdk_chunk(frame)


def test_stream_with_usage_adds_usage_chunk(ctx: ProtocolContext, sse_frames: Split) -> None:
    job = parse(ctx, prompt="Once", stream=True, stream_options={"include_usage": True})
    frames = sse_frames(run_stream(job, ctx, ["x", "", "y"]))
    assert [f["usage"] for f in frames[:-2]] == [None] * 3
    assert (frames[-2]["choices"], frames[-2]["usage"]["total_tokens"]) == ([], 6)
    assert frames[-1] == "[DONE]"
    chunks = [sdk_chunk(f) for f in frames[:-1]]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "xy"


def test_stream_error_frame_then_done(ctx: ProtocolContext, sse_frames: Split) -> None:
    renderer = FORMAT.renderer(parse(ctx, prompt="x", stream=True), ctx)
    frames = sse_frames(renderer.error(QueueFull("too many requests waiting")))
    assert frames == [
        {
            "error": {
                "message": "too many requests waiting",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        },
        "[DONE]",
    ]
    assert renderer.heartbeat() == KEEP_ALIVE


def test_parse_logprobs_is_an_integer_of_alternatives(ctx: ProtocolContext) -> None:
    assert parse(ctx, prompt="x").request.logprobs is None
    assert parse(ctx, prompt="x", logprobs=0).request.logprobs == 0
    assert parse(ctx, prompt="x", logprobs=5).request.logprobs == 5
    assert parse_error(ctx, prompt="x", logprobs=21).param == "logprobs"
    assert parse_error(ctx, prompt="x", logprobs=True).param == "logprobs"


def test_parse_warns_when_the_servers_default_limit_applies(ctx: ProtocolContext) -> None:
    limit = f"stops at the server's default of {ctx.defaults.max_tokens} tokens (--max-tokens)"
    assert [w for w in parse(ctx, prompt="hi").warnings if limit in w]
    assert not parse(ctx, prompt="hi", max_tokens=3).warnings


def test_a_thinking_models_completion_runs_under_the_reasoning_budget_and_keeps_its_thinking(
    ctx: ProtocolContext,
) -> None:
    """The server's --reasoning-budget bounds a plain completion as it does a chat turn, the
    request's own field wins, and the text is the continuation whole (no reasoning split off:
    this API has nowhere else to put it)."""
    thinking = replace(
        ctx,
        tokenizer=replace(ctx.tokenizer, thinks=True),  # type: ignore[type-var]
        defaults=replace(ctx.defaults, reasoning_budget=64, reasoning_budget_message="Enough."),
    )
    server = parse(thinking, prompt="<think>\n").request
    assert (server.thinking_budget, server.split_reasoning) == (64, False)
    assert server.thinking_budget_message == tuple(thinking.tokenizer.encode_continuation("Enough."))
    asked = parse(thinking, prompt=["a", "b"], thinking_budget_tokens=3, thinking_budget_message="")
    assert (asked.request.thinking_budget, asked.request.thinking_budget_message) == (3, ())
    assert parse(thinking, prompt="x", thinking_budget_tokens=-1).request.thinking_budget is None
    refused = parse_error(thinking, prompt="x", thinking_budget_tokens=-2)
    assert refused.param == "thinking_budget_tokens"
    plain = parse(ctx, prompt="x", thinking_budget_tokens=3)  # a model that does not think: told
    assert plain.request.thinking_budget is None and any(
        "`thinking_budget_tokens`" in w for w in plain.warnings
    )
