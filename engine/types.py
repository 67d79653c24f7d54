"""Records that cross the engine boundary: what a request asks for, what comes back."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

MIN_TEMPERATURE = 1e-6  # a temperature below this samples greedily (see SamplingParams.greedy)
MIN_TOP_P = 1e-30  # a top_p below this keeps the most likely token only (float32's range)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Resolved sampling for one request (server defaults already applied)."""

    # A real-valued knob declares its range here, once: engine.validation checks every field
    # that has one (a 400 naming it), so a new one is this field, its use in engine.rows.sampling
    # and the protocol field that sets it.
    temperature: float = field(default=0.0, metadata={"range": (0.0, None)})
    top_p: float = field(default=1.0, metadata={"range": (0.0, 1.0)})
    top_k: int = 0
    min_p: float = field(default=0.0, metadata={"range": (0.0, 1.0)})
    repetition_penalty: float = field(default=0.0, metadata={"range": (0.0, None)})
    repetition_context_size: int = 20
    presence_penalty: float = field(default=0.0, metadata={"range": (None, None)})
    presence_context_size: int = 20
    frequency_penalty: float = field(default=0.0, metadata={"range": (None, None)})
    frequency_context_size: int = 20
    logit_bias: dict[int, float] | None = None
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        # Below MIN_TEMPERATURE sampling is argmax in all but name, and 1/t overflows float32
        # near 1e-38 (the logits would be inf/nan): such a row samples greedily.
        return self.temperature < MIN_TEMPERATURE


@dataclass(frozen=True, slots=True)
class Request:
    """One generation: prompt token ids in, events out."""

    id: str
    prompt_tokens: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    # n > 1: the first choice leaves its prompt KV in the prefix cache for the others,
    # which wait (`after`) until it is decoding, so one prefill serves them all.
    share_prompt: bool = False
    after: str | None = None
    # The tools offered (OpenAI function schemas): their calls are parsed out of the text.
    tools: tuple[dict[str, Any], ...] | None = None
    # Log-probabilities of each sampled token with this many top alternatives (None: off).
    logprobs: int | None = None
    # Speculative decoding: at most this many draft tokens a step (None: the server's; 0: off),
    # and the client's predicted output (OpenAI Predicted Outputs), tokenized.
    num_draft_tokens: int | None = None
    prediction: tuple[int, ...] | None = None
    # llguidance grammar text every generated token must follow (None: free text).
    grammar: str | None = None
    # The grammar forces tool calls, written in hermes markup whatever the model family.
    forced_tool_calls: bool = False
    # Reasoning tokens before the model's end-of-thinking is forced (None: unbounded; 0: none),
    # and the tokens of a message forced before it when it is (engine.rows.thinking_budget).
    thinking_budget: int | None = None
    thinking_budget_message: tuple[int, ...] = ()
    # False: the reasoning stays in the text, its markers too (a plain completion's text is the
    # model's continuation as written: it has no reasoning channel).
    split_reasoning: bool = True


class CacheMiss(enum.Enum):
    """Why a prompt was not served from the prefix cache further than it was."""

    COLD = "cold"  # no block of it was ever cached
    EVICTED = "evicted"  # its next block was cached once and is gone


class FinishReason(enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    TOOL_CALLS = "tool_calls"


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    drafted_tokens: int = 0  # speculative decoding: draft tokens verified, and how many were accepted
    accepted_tokens: int = 0
    predicted: bool = False  # the drafts came from the client's prediction (Predicted Outputs)
    cached_disk_tokens: int = 0  # of cached_tokens, those read back from the prefix cache's disk tier
    cache_miss: CacheMiss | None = None  # why no more of the prompt was cached (None: nothing more ever was)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One sampled token: its text, log-probability, and the top alternatives at that step."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TextDelta:
    """New text, already cut at a UTF-8 boundary and clear of any stop string."""

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Model reasoning (a `<think>` span), kept apart from the answer."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """A tool call begins: its position in this turn, its id and the function's name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ToolCallArgsDelta:
    """More of a tool call's JSON arguments text."""

    index: int
    arguments: str


@dataclass(frozen=True, slots=True)
class EngineTimings:
    """Where one request's time went inside the engine, in seconds from its arrival there."""

    admitted_s: float  # waiting for a batch slot (admission wait)
    prefill_chunks: tuple[tuple[int, float], ...]  # (prompt tokens, seconds of that step)
    first_token_s: float | None
    finished_s: float
    # When the engine took the request in, on the machine-wide monotonic clock (time.perf_counter
    # in any process), so the hop from the server to an engine process can be told apart.
    arrived_at: float | None = None
    # The first delta sent to the consumer (a token's text may be held back: UTF-8, stop strings).
    first_delta_s: float | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    reason: FinishReason
    usage: Usage
    stop_sequence: str | None = None
    timings: EngineTimings | None = None


Delta = TextDelta | ReasoningDelta | ToolCallStart | ToolCallArgsDelta
Event = Delta | Finished


@dataclass(frozen=True, slots=True)
class Admitted:
    """A request's row has begun: how much of its prompt the prefix cache served, and why not
    more. A note for the server's own account (access log, trace) of a request its client may
    leave before it finishes; the consumer's stream keeps it and never yields it."""

    cached_tokens: int
    cache_miss: CacheMiss | None = None


Emitted = Event | Admitted  # what the engine emits for a request


@dataclass(slots=True)
class Counters:
    """Engine-side facts tests and /stats can observe."""

    requests_started: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_failed: int = 0
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually computed (the rest came from the prefix cache)
    prompt_tokens_from_disk: int = 0  # prompt tokens the prefix cache read back from its disk tier
    generated_tokens: int = 0
    spec_decode_num_drafts: int = 0  # speculative decoding: row-steps that verified drafts,
    spec_decode_num_draft_tokens: int = 0  # the draft tokens verified,
    spec_decode_num_accepted_tokens: int = 0  # and those accepted
    num_requests_running: int = 0  # gauges, refreshed every engine step
    num_requests_waiting: int = 0
    kv_cache_usage_perc: float = 0.0  # KV tokens held / the admission plan's KV capacity
    prefix_cache_bytes: int = 0  # what the prefix cache holds in memory,
    prefix_cache_blocks: int = 0  # in this many blocks (entries, where caches are not cut in blocks)
    # The loop's own account (how full the batch ran, how much of the time was spent joining):
    engine_steps: int = 0  # steps run
    engine_step_rows: int = 0  # decoding rows summed over steps (÷ steps: the batch's mean width)
    engine_join_steps: int = 0  # steps that carried prompt chunks
    engine_step_seconds: float = 0.0  # wall time inside steps
    engine_join_step_seconds: float = 0.0  # of which in steps that carried prompt chunks


# An embeddings input: a text, or the model's own token ids taken as they are.
EmbedInput = str | list[int]
