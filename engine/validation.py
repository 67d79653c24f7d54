"""Every field of a request checked against the loaded model before it is admitted.

What passes here cannot raise later inside the engine for its own reasons (an MLX PRNG key out
of range, a top-k past the vocabulary, a slice past int32), so one client's bad value is a 400
naming its field, never a fault in a running batch. The protocols check what their wire format
says (types, documented ranges); this is the one place that knows what the engine can take, and
the server calls it after parsing, for every format. `names` spells an engine field the way the
format does (`stop` is Anthropic's `stop_sequences`), so the 400 names what the client sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.types import Request, SamplingParams

SEED_LIMIT = 1 << 64  # mx.random.key takes a uint64
MAX_CHOICES = 16
MAX_TOP_LOGPROBS = 20
MAX_DRAFT_TOKENS = 16
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024  # a stop string is matched against held-back text every token
INT32_LIMIT = (1 << 31) - 1  # MLX indexes with int32: the bound when the context is not known
CONTEXT_SIZES = ("repetition_context_size", "presence_context_size", "frequency_context_size")


@dataclass(frozen=True, slots=True)
class Limits:
    """What the loaded model can take: its vocabulary and the longest context a request may use."""

    vocab_size: int
    context_length: int | None = None

    @property
    def context(self) -> int:
        return self.context_length if self.context_length is not None else INT32_LIMIT


def validate_call(
    requests: Sequence[Request], limits: Limits, names: Mapping[str, str] | None = None
) -> None:
    """One API call's requests (one per choice): InvalidRequest naming the first bad field."""
    if not 1 <= len(requests) <= MAX_CHOICES:
        raise InvalidRequest(f"`n` must be between 1 and {MAX_CHOICES}", param="n")
    for request in requests:
        Check(limits, names or {}).request(request)


@dataclass(frozen=True, slots=True)
class Check:
    limits: Limits
    names: Mapping[str, str]

    def fail(self, field: str, must: str) -> InvalidRequest:
        name = self.names.get(field, field)
        return InvalidRequest(f"`{name}` must be {must}", param=name)

    def request(self, r: Request) -> None:
        self.token_ids("prompt_tokens", r.prompt_tokens, "a non-empty list of this model's token ids")
        if not _is_int(r.max_tokens) or r.max_tokens < 1:
            raise self.fail("max_tokens", "an integer of at least 1")
        self.sampling(r.sampling)
        self.stop(r.stop)
        self.optional_range("logprobs", r.logprobs, MAX_TOP_LOGPROBS)
        self.optional_range("num_draft_tokens", r.num_draft_tokens, MAX_DRAFT_TOKENS)
        if r.prediction is not None:
            self.token_ids("prediction", r.prediction, "text this model's tokens can spell")
            if len(r.prediction) > self.limits.context:
                raise self.fail("prediction", f"at most {self.limits.context} tokens long")
        if r.grammar is not None and (not isinstance(r.grammar, str) or not r.grammar):
            raise self.fail("response_format", "a grammar that compiles")
        if r.tools is not None and not all(isinstance(t, dict) for t in r.tools):
            raise self.fail("tools", "a list of objects")

    def token_ids(self, field: str, ids: tuple[int, ...], must: str) -> None:
        vocab = self.limits.vocab_size
        if not isinstance(ids, tuple) or not ids or not all(_is_int(t) for t in ids):
            raise self.fail(field, must)
        if min(ids) < 0 or max(ids) >= vocab:
            raise self.fail(field, f"{must} (0..{vocab - 1})")

    def sampling(self, s: SamplingParams) -> None:
        for knob in fields(SamplingParams):
            if (bounds := knob.metadata.get("range")) is not None:
                self.real(knob.name, getattr(s, knob.name), *bounds)
        if s.top_p == 0.0:
            raise self.fail("top_p", "above 0")
        vocab = self.limits.vocab_size
        if not _is_int(s.top_k) or not 0 <= s.top_k < vocab:
            raise self.fail("top_k", f"an integer from 0 (off) to {vocab - 1}, below this model's vocabulary")
        for field in CONTEXT_SIZES:
            self.optional_range(field, getattr(s, field), self.limits.context)
        if s.seed is not None and (not _is_int(s.seed) or not 0 <= s.seed < SEED_LIMIT):
            raise self.fail("seed", f"an integer from 0 to {SEED_LIMIT - 1}")
        self.logit_bias(s.logit_bias)

    def logit_bias(self, bias: dict[int, float] | None) -> None:
        if not bias:
            return
        vocab = self.limits.vocab_size
        for token, value in bias.items():
            if not _is_int(token) or not 0 <= token < vocab:
                raise self.fail("logit_bias", f"keyed by token ids of this model (0..{vocab - 1})")
            self.real("logit_bias", value)

    def stop(self, stops: tuple[str, ...]) -> None:
        if len(stops) > MAX_STOP_STRINGS:
            raise self.fail("stop", f"at most {MAX_STOP_STRINGS} strings")
        for s in stops:
            if not isinstance(s, str) or not 1 <= len(s) <= MAX_STOP_CHARS:
                raise self.fail("stop", f"strings of 1 to {MAX_STOP_CHARS} characters")

    def real(self, field: str, value: float, low: float | None = None, high: float | None = None) -> None:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if ok and (low is None or value >= low) and (high is None or value <= high):
            return
        bounds = "a finite number" if low is None else f"a number of at least {low:g}"
        raise self.fail(field, bounds if high is None else f"between {low:g} and {high:g}")

    def optional_range(self, field: str, value: int | None, high: int) -> None:
        if value is not None and (not _is_int(value) or not 0 <= value <= high):
            raise self.fail(field, f"an integer from 0 to {high}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
