"""Tier 1: every request field is checked against the model before admission (issue 15, items 1, 3)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.types import Request, SamplingParams
from mlx_serve.engine.validation import SEED_LIMIT, Limits, validate_call

LIMITS = Limits(vocab_size=1000, context_length=4096)
GOOD = Request("r", (1, 2, 3), SamplingParams(temperature=0.7, seed=1), max_tokens=8)


def refused(request: Request, names: dict[str, str] | None = None, n: int = 1) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as info:
        validate_call([request] * n, LIMITS, names)
    assert info.value.status == 400
    return info.value


def sampled(**fields: Any) -> Request:
    return replace(GOOD, sampling=replace(GOOD.sampling, **fields))


def test_validation_passes_a_good_request_and_every_boundary() -> None:
    validate_call([GOOD], LIMITS)
    edges = [
        sampled(seed=0),
        sampled(seed=SEED_LIMIT - 1),
        sampled(top_k=999),
        sampled(top_k=0),
        sampled(repetition_context_size=4096),
        sampled(logit_bias={0: -100.0, 999: 5}),
        replace(GOOD, prompt_tokens=(0, 999), stop=("x" * 1024,), logprobs=20, num_draft_tokens=0),
    ]
    for request in edges:
        validate_call([request], LIMITS)
    validate_call([GOOD], Limits(vocab_size=1000))  # no known context: int32 is the bound


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        (sampled(seed=-1), "seed"),  # issue 15 item 1: mx.random.key refuses these inside admit
        (sampled(seed=SEED_LIMIT), "seed"),
        (sampled(top_k=10**12), "top_k"),  # item 3
        (sampled(top_k=1000), "top_k"),  # mlx-lm's apply_top_k takes 0 < k < vocab only
        (sampled(repetition_context_size=2**63 - 1), "repetition_context_size"),
        (sampled(presence_context_size=10**12), "presence_context_size"),
        (sampled(frequency_context_size=4097), "frequency_context_size"),
        (sampled(temperature=float("nan")), "temperature"),
        (sampled(temperature=-0.1), "temperature"),
        (sampled(top_p=0.0), "top_p"),
        (sampled(top_p=1.5), "top_p"),
        (sampled(min_p=2.0), "min_p"),
        (sampled(repetition_penalty=float("inf")), "repetition_penalty"),
        (sampled(presence_penalty=float("-inf")), "presence_penalty"),
        (sampled(logit_bias={1000: 1.0}), "logit_bias"),
        (sampled(logit_bias={-1: 1.0}), "logit_bias"),
        (sampled(logit_bias={5: float("nan")}), "logit_bias"),
        (replace(GOOD, prompt_tokens=()), "prompt_tokens"),
        (replace(GOOD, prompt_tokens=(1, 1000)), "prompt_tokens"),
        (replace(GOOD, prompt_tokens=(1, -1)), "prompt_tokens"),
        (replace(GOOD, prompt_tokens=(1, 2.0)), "prompt_tokens"),  # type: ignore[arg-type]
        (replace(GOOD, max_tokens=0), "max_tokens"),
        (replace(GOOD, stop=("",)), "stop"),
        (replace(GOOD, stop=("x" * 1025,)), "stop"),
        (replace(GOOD, stop=("a",) * 17), "stop"),
        (replace(GOOD, logprobs=21), "logprobs"),
        (replace(GOOD, num_draft_tokens=17), "num_draft_tokens"),
        (replace(GOOD, prediction=(5000,)), "prediction"),
        (replace(GOOD, grammar=""), "response_format"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_validation_refuses_each_bad_field_naming_it(request_: Request, param: str) -> None:
    exc = refused(request_)
    assert exc.param == param and f"`{param}`" in exc.message


def test_validation_names_the_field_as_the_format_spells_it() -> None:
    exc = refused(replace(GOOD, stop=("",)), {"stop": "stop_sequences"})
    assert exc.param == "stop_sequences" and "`stop_sequences` must be" in exc.message


def test_validation_checks_every_choice_of_a_call() -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_call([sampled(seed=SEED_LIMIT - 1), sampled(seed=SEED_LIMIT)], LIMITS)
    assert info.value.param == "seed"  # the server gives choice i the seed + i
    assert refused(GOOD, n=17).param == "n"


def test_every_real_sampling_knob_declares_the_range_validation_checks() -> None:
    from dataclasses import fields

    from mlx_serve.engine.types import SamplingParams

    real = [f.name for f in fields(SamplingParams) if f.type in ("float", float)]
    assert real and all("range" in f.metadata for f in fields(SamplingParams) if f.name in real)
