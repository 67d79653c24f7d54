"""What the OpenAI formats share on the request side.

The request fields they accept (sampling, limits, stop, stream options and the fields we refuse
until they are supported), their validation errors, and the job built from them. What they share
on the way out (the error envelope, the usage object, the stream's chunks) is protocols.openai_render.
"""

from __future__ import annotations

import os
import re
import uuid
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from msgspec import Meta, Struct

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.types import Request, SamplingParams
from mlx_serve.protocols import structured
from mlx_serve.protocols.contract import (
    Job,
    ProtocolContext,
)
from mlx_serve.protocols.conversation import warning
from mlx_serve.protocols.reasoning import ThinkingBudget

MAX_CHOICES = 16
MAX_STOP_STRINGS = 16

_ERROR_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING_FIELD = re.compile(r"missing required field `(?P<field>[^`]+)`")

PositiveInt = Annotated[int, Meta(ge=1)]
NonNegativeInt = Annotated[int, Meta(ge=0)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
Bias = Annotated[float, Meta(ge=-100, le=100)]
StopString = Annotated[str, Meta(min_length=1)]
StopList = Annotated[list[StopString], Meta(max_length=MAX_STOP_STRINGS)]

T = TypeVar("T")


class StreamOptions(Struct, frozen=True):
    include_usage: bool | None = None


class JsonSchemaSpec(Struct, frozen=True):
    """`response_format.json_schema`; `strict` or not, the schema is enforced."""

    name: str | None = None
    schema: dict[str, Any] | bool | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(Struct, frozen=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StructuredOutputs(Struct, frozen=True):
    """vLLM's `structured_outputs`: one of its constraints."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: Any = None


class OpenAIFields(Struct, frozen=True, kw_only=True):
    """Fields both OpenAI endpoints accept. Unknown fields are ignored, never an error."""

    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Meta(ge=0)] | None = None
    repetition_context_size: NonNegativeInt | None = None
    presence_penalty: Penalty | None = None
    presence_context_size: NonNegativeInt | None = None
    frequency_penalty: Penalty | None = None
    frequency_context_size: NonNegativeInt | None = None
    logit_bias: dict[str, Bias] | None = None
    stop: StopString | StopList | None = None
    seed: int | None = None
    n: Annotated[int, Meta(ge=1, le=MAX_CHOICES)] | None = None
    logprobs: bool | int | None = None
    top_logprobs: int | None = None
    # Structured output: OpenAI's response_format, or vLLM's extras (one at most).
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # llama.cpp's spellings: a GBNF (or Lark) grammar, and a JSON schema the answer follows.
    grammar: str | None = None
    json_schema: dict[str, Any] | bool | None = None
    # Fields that would change the answer; refused until supported.
    prediction: Any = None
    xtc_probability: Annotated[float, Meta(ge=0, le=1)] | None = None
    adapters: str | None = None
    draft_model: str | None = None
    num_draft_tokens: int | None = None


def decode(decoder: msgspec.json.Decoder[T], body: bytes) -> T:
    """Decode a request body; malformed JSON or a schema mismatch is a 400 naming the field."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        message = str(exc)
        raise InvalidRequest(f"invalid request: {message}", param=error_param(message)) from exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"could not parse JSON body: {exc}") from exc


def invalid_at(exc: msgspec.ValidationError, path: str) -> InvalidRequest:
    """A ValidationError on one part of the body (`input[2]`, `tools[0]`), its path made whole."""
    message = str(exc)
    at = f"`$.{path}"
    message = message.replace("`$", at) if " - at `$" in message else f"{message} - at {at}`"
    return InvalidRequest(f"invalid request: {message}", param=error_param(message))


def error_param(message: str) -> str | None:
    """The field a msgspec ValidationError message points at, as `messages[0].role`."""
    at = _ERROR_PATH.search(message)
    path = at["path"].lstrip(".") if at else ""
    missing = _MISSING_FIELD.search(message)
    if missing:
        path = f"{path}.{missing['field']}" if path else missing["field"]
    return path or None


def unsupported(param: str, what: str | None = None) -> InvalidRequest:
    return InvalidRequest(f"{what or f'`{param}`'} is not supported yet", param=param)


def check_supported(fields: OpenAIFields, ctx: ProtocolContext | None = None) -> None:
    """Refuse fields we accept in the schema but cannot honour yet."""
    if fields.structured_outputs is not None and fields.structured_outputs.structural_tag is not None:
        raise unsupported("structured_outputs.structural_tag")
    if fields.xtc_probability:
        raise unsupported("xtc_probability", "`xtc_probability` > 0")
    _check_model_options(fields, ctx.adapter if ctx is not None else None)


def _check_model_options(fields: OpenAIFields, adapter: str | None) -> None:
    # mlx_lm.server's per-request adapters and draft models; "default_model" means "the server's".
    if fields.adapters:
        check_adapters(fields.adapters, adapter)
    if fields.draft_model not in (None, "default_model"):
        raise unsupported("draft_model")
    if fields.num_draft_tokens is not None and not 0 <= fields.num_draft_tokens <= MAX_DRAFT_TOKENS:
        raise InvalidRequest(
            f"`num_draft_tokens` must be between 0 and {MAX_DRAFT_TOKENS}", param="num_draft_tokens"
        )


MAX_DRAFT_TOKENS = 16

HOW_TO_SERVE_ADAPTERS = (
    "start the server with `--adapter-path DIR` to serve one adapter, or with `--adapter NAME=DIR` "
    'and ask for `model: "BASE:NAME"` to serve several beside their base'
)


def check_adapters(requested: str, served: str | None) -> None:
    """mlx_lm.server's `adapters` (an adapter folder): honoured when it is the folder this model
    is served with, else refused by name (loading adapters per request is not done here)."""
    if served is not None and same_folder(requested, served):
        return
    serving = (
        f"this model is served with adapter {served!r}"
        if served
        else "this model is served without an adapter"
    )
    raise InvalidRequest(
        f"`adapters` {requested!r} is not an adapter this server was started with ({serving}); "
        f"{HOW_TO_SERVE_ADAPTERS}",
        param="adapters",
    )


def same_folder(a: str, b: str) -> bool:
    """Whether two folder paths name one folder (relative ones from the server's directory)."""
    return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))


def prediction_tokens(prediction: Any, ctx: ProtocolContext) -> tuple[int, ...] | None:
    """OpenAI Predicted Outputs: `{"type": "content", "content": text or text parts}` → token ids."""
    if prediction is None:
        return None
    if not isinstance(prediction, dict) or prediction.get("type") != "content":
        raise InvalidRequest(
            '`prediction` must be {"type": "content", "content": ...}', param="prediction.type"
        )
    content = prediction.get("content")
    if isinstance(content, list):
        if not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
            raise InvalidRequest("`prediction.content` parts must be text parts", param="prediction.content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise InvalidRequest(
            "`prediction.content` must be a string or a list of text parts", param="prediction.content"
        )
    return tuple(ctx.tokenizer.encode_continuation(content)) if content else None


def sampling_params(fields: OpenAIFields, ctx: ProtocolContext) -> SamplingParams:
    """Request fields over the server's defaults, normalised to the engine's conventions."""
    return ctx.defaults.sampling_for(
        temperature=fields.temperature,
        top_p=fields.top_p,
        top_k=fields.top_k,
        min_p=fields.min_p,
        repetition_penalty=fields.repetition_penalty,
        repetition_context_size=fields.repetition_context_size,
        presence_penalty=fields.presence_penalty,
        presence_context_size=fields.presence_context_size,
        frequency_penalty=fields.frequency_penalty,
        frequency_context_size=fields.frequency_context_size,
        logit_bias=logit_bias(fields.logit_bias, ctx.tokenizer.vocab_size),
        seed=fields.seed,
    )


def _pick(value: T | None, default: T) -> T:
    return default if value is None else value


MAX_TOKEN_DIGITS = 12


def logit_bias(raw: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """JSON object keys are strings; each must name a token of this model's vocabulary."""
    if not raw:
        return None
    bias: dict[int, float] = {}
    for key, value in raw.items():
        # A token id has a few digits; int() of thousands of them raises (CPython's digit limit).
        token = int(key) if key.isascii() and key.isdigit() and len(key) <= MAX_TOKEN_DIGITS else -1
        if not 0 <= token < vocab_size:
            shown = key if len(key) <= MAX_TOKEN_DIGITS else key[:MAX_TOKEN_DIGITS] + "..."
            raise InvalidRequest(
                f"`logit_bias` key {shown!r} is not a token id of this model (0..{vocab_size - 1})",
                param=f"logit_bias.{shown}",
            )
        bias[token] = float(value)
    return bias


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def max_tokens(fields: OpenAIFields, ctx: ProtocolContext) -> int:
    # max_completion_tokens is the newer name and wins when both are sent.
    return _pick(fields.max_completion_tokens, _pick(fields.max_tokens, ctx.defaults.max_tokens))


def default_limit_warnings(fields: OpenAIFields, ctx: ProtocolContext) -> tuple[str, ...]:
    """The note owed to a request that sets no limit: the server's --max-tokens cuts its answer
    (`finish_reason: length`), which a client that never asked for a limit does not expect."""
    if fields.max_tokens is not None or fields.max_completion_tokens is not None:
        return ()
    return (
        warning(
            f"the request sets no `max_tokens`: the answer stops at the server's default of "
            f"{ctx.defaults.max_tokens} tokens (--max-tokens), with finish_reason 'length'"
        ),
    )


def include_usage(fields: OpenAIFields) -> bool:
    options = fields.stream_options
    return bool(fields.stream and options is not None and options.include_usage)


MAX_TOP_LOGPROBS = 20


def chat_logprobs(fields: OpenAIFields) -> int | None:
    """Chat's `logprobs: true` with `top_logprobs` (0-20) → alternatives per token; None: off."""
    if fields.logprobs is None or fields.logprobs is False:
        if fields.top_logprobs is not None and fields.top_logprobs > 0:
            raise InvalidRequest("`top_logprobs` needs `logprobs: true`", param="top_logprobs")
        return None
    if type(fields.logprobs) is not bool:
        raise InvalidRequest("`logprobs` must be a boolean", param="logprobs")
    return _top(max(fields.top_logprobs or 0, 0), "top_logprobs")  # mlx_lm's -1 means none


def completion_logprobs(fields: OpenAIFields) -> int | None:
    """Completions' integer `logprobs` (0-20) → alternatives per token; None: off."""
    if fields.logprobs is None or fields.logprobs is False:
        return None
    if type(fields.logprobs) is not int:
        raise InvalidRequest("`logprobs` must be an integer between 0 and 20", param="logprobs")
    return _top(fields.logprobs, "logprobs")


def _top(n: int, param: str) -> int:
    if not 0 <= n <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"`{param}` must be between 0 and {MAX_TOP_LOGPROBS}", param=param)
    return n


_GUIDES = {
    "json": structured.json_schema,
    "regex": structured.regex,
    "choice": structured.choice,
    "grammar": structured.grammar,
}


def output_grammar(fields: OpenAIFields) -> str | None:
    """The grammar of the whole answer: response_format or one of vLLM's guides, checked."""
    asked: list[tuple[str, str, Any]] = []  # (param, kind, value)
    rf = fields.response_format
    if rf is not None and rf.type != "text":
        if rf.type == "json_schema" and rf.json_schema is None:
            raise InvalidRequest(
                "`response_format` of type 'json_schema' needs `json_schema`",
                param="response_format.json_schema",
            )
        schema = rf.json_schema.schema if rf.json_schema is not None else None
        param = "response_format.json_schema.schema" if rf.json_schema else "response_format"
        asked.append((param, "json", structured.ANY_OBJECT if schema is None else schema))
    asked += [(f"guided_{kind}", kind, getattr(fields, f"guided_{kind}")) for kind in _GUIDES]
    asked += [("grammar", "grammar", fields.grammar), ("json_schema", "json", fields.json_schema)]
    so = fields.structured_outputs
    if so is not None:
        asked += [(f"structured_outputs.{kind}", kind, getattr(so, kind)) for kind in _GUIDES]
        if so.json_object:
            asked.append(("structured_outputs.json_object", "json", structured.ANY_OBJECT))
    asked = [a for a in asked if a[2] is not None]
    if len(asked) > 1:
        raise InvalidRequest(
            f"`{asked[0][0]}` and `{asked[1][0]}` both constrain the answer; give one", param=asked[1][0]
        )
    return _GUIDES[asked[0][1]](asked[0][2], asked[0][0]) if asked else None


def build_job(
    fields: OpenAIFields,
    prompt_tokens: list[int],
    ctx: ProtocolContext,
    id_prefix: str,
    tools: list[dict[str, Any]] | None = None,
    logprobs: int | None = None,
    forced_calls: str | None = None,
    warnings: tuple[str, ...] = (),
    thinking: ThinkingBudget | None = None,
) -> Job:
    """The engine request plus the client's delivery choices; `forced_calls` is the grammar
    of a tool_choice that forces calls."""
    constraint = structured.pick(forced_calls, output_grammar(fields), "response_format")
    thinking = thinking.under_grammar(constraint.grammar) if thinking else None
    request = Request(
        id=f"{id_prefix}-{uuid.uuid4().hex}",
        prompt_tokens=tuple(prompt_tokens),
        sampling=sampling_params(fields, ctx),
        max_tokens=max_tokens(fields, ctx),
        stop=stop_strings(fields.stop),
        tools=tuple(tools) if tools else None,
        logprobs=logprobs,
        num_draft_tokens=fields.num_draft_tokens,
        prediction=prediction_tokens(fields.prediction, ctx),
        grammar=constraint.grammar,
        forced_tool_calls=constraint.forced,
        thinking_budget=thinking.tokens if thinking else None,
        thinking_budget_message=thinking.message if thinking else (),
    )
    return Job(
        request,
        stream=bool(fields.stream),
        include_usage=include_usage(fields),
        model=fields.model or ctx.model_id,
        n=fields.n or 1,
        warnings=(
            warnings
            + constraint.warnings
            + default_limit_warnings(fields, ctx)
            + (thinking.warnings if thinking else ())
        ),
    )
