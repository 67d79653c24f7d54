"""OpenAI Responses request bodies as msgspec Structs, and what a request asks of the engine
beyond its prompt: the fields refused, `tool_choice` resolved against the tools offered, the
grammar the answer follows, the sampling, and the settings the response object repeats.
openai_responses builds the engine request from these; the prompt's items are
`responses_input`'s, the tools `responses_tools`'.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.types import Request, SamplingParams
from mlx_serve.protocols import conversation as conv
from mlx_serve.protocols import openai_common as common
from mlx_serve.protocols import structured
from mlx_serve.protocols.contract import ProtocolContext
from mlx_serve.protocols.responses_tools import Toolset


class TextFormat(Struct, frozen=True, omit_defaults=True):
    """`text.format`: plain text, any JSON object, or JSON valid against `schema`."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | bool | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(Struct, frozen=True):
    format: TextFormat | None = None
    verbosity: str | None = None  # a hint a local model may not follow


class ReasoningConfig(Struct, frozen=True):
    effort: str | None = None
    summary: str | None = None


class ResponsesBody(Struct, frozen=True, kw_only=True):
    """The body of POST /v1/responses. Unknown fields are ignored, never an error; so are
    `client_metadata` (Codex's) and `prompt_cache_retention`: the prefix cache needs no key."""

    model: str | None = None
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool | None = None
    stream: bool | None = None
    max_output_tokens: common.PositiveInt | None = None
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    presence_penalty: common.Penalty | None = None
    frequency_penalty: common.Penalty | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    # Answer-changing fields refused until supported.
    top_logprobs: int | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    context_management: Any = None


RESPONSES_DECODER = msgspec.json.Decoder(ResponsesBody)


@dataclass(frozen=True, slots=True)
class Choice:
    """`tool_choice` resolved against the tools: `none`, `auto` or `required`; the one tool it
    names (by its name in the prompt); the subset `allowed_tools` permits."""

    mode: Literal["none", "auto", "required"] = "auto"
    name: str | None = None
    allowed: tuple[str, ...] | None = None


def check_supported(req: ResponsesBody) -> None:
    if req.top_logprobs:
        raise common.unsupported("top_logprobs")
    if req.include and "message.output_text.logprobs" in req.include:
        raise common.unsupported("include", "`include` of 'message.output_text.logprobs'")
    if req.background:
        raise common.unsupported("background")
    for name in ("conversation", "prompt", "context_management"):
        if getattr(req, name) is not None:
            raise common.unsupported(name)


def tool_choice(raw: str | dict[str, Any] | None, tools: Toolset) -> Choice:
    """Every form the API takes: a mode, one function or custom tool, or `allowed_tools`."""
    if raw is None or raw in ("none", "auto", "required"):
        return Choice(raw or "auto")  # type: ignore[arg-type]
    if isinstance(raw, str):
        raise InvalidRequest(f"`tool_choice` {raw!r} is not one of none, auto, required", param="tool_choice")
    kind = raw.get("type")
    if kind in ("function", "custom") and isinstance(raw.get("name"), str):
        return Choice("required", _chosen(tools, raw, "tool_choice"))
    if kind == "allowed_tools":
        mode = raw.get("mode", "auto")
        picked = raw.get("tools")
        if mode not in ("auto", "required") or not isinstance(picked, list) or not picked:
            raise InvalidRequest(
                "`allowed_tools` needs `mode` auto or required and a list of `tools`", param="tool_choice"
            )
        names = tuple(_chosen(tools, t, f"tool_choice.tools[{i}]") for i, t in enumerate(picked))
        return Choice(mode, allowed=names)
    raise InvalidRequest(
        f"`tool_choice` of type {kind!r} forces a tool this server does not offer", param="tool_choice.type"
    )


def _chosen(tools: Toolset, raw: Any, param: str) -> str:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise InvalidRequest('a tool choice names its tool: {"type": …, "name": …}', param=param)
    name = tools.model_name(raw["name"], raw.get("namespace"))
    if name not in tools.offered:
        offered = ", ".join(repr(t.name) for t in tools.offered.values())
        raise InvalidRequest(
            f"`{param}` names the tool {raw['name']!r}, which is not among the tools offered ({offered or 'none'})",
            param=param,
        )
    return name


def answer_grammar(
    req: ResponsesBody, template: list[dict[str, Any]], choice: Choice
) -> structured.Constraint:
    """The grammar the answer follows (a tool choice that constrains calls, else text.format)."""
    parallel = req.parallel_tool_calls is not False
    allowed = [t for t in template if t["function"]["name"] in (choice.allowed or ())]
    if choice.allowed is not None and choice.mode == "auto":
        calls: str | None = structured.allowed_calls(allowed, parallel)
    elif choice.allowed is not None:
        calls = structured.forced_calls(allowed, None, True, parallel)
    else:
        calls = structured.forced_calls(template, choice.name, choice.mode == "required", parallel)
    fmt = req.text.format if req.text is not None else None
    output = None
    if fmt is not None and fmt.type != "text":  # json_object: any object, whatever `schema` says
        schema = fmt.schema if fmt.type == "json_schema" else None
        output = structured.json_schema(schema, "text.format.schema")
    return structured.pick(calls, output, "text.format")


def sampling_params(ctx: ProtocolContext, req: ResponsesBody) -> SamplingParams:
    sampling = conv.sampling(
        ctx, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p
    )
    return replace(
        sampling, presence_penalty=req.presence_penalty or 0.0, frequency_penalty=req.frequency_penalty or 0.0
    )


def echo_settings(req: ResponsesBody, request: Request, tools: Toolset) -> dict[str, Any]:
    """The request's settings as the response object repeats them, with defaults applied:
    every field Open Responses requires."""
    reasoning = req.reasoning or ReasoningConfig()
    fmt = req.text.format if req.text else None
    return {
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": reasoning.effort, "summary": reasoning.summary},
        "service_tier": "default",
        "store": req.store is not False,
        "temperature": request.sampling.temperature,
        "text": {
            "format": msgspec.to_builtins(fmt) if fmt else {"type": "text"},
            "verbosity": (req.text.verbosity if req.text else None) or "medium",
        },
        "tool_choice": req.tool_choice or "auto",
        "tools": tools.echo,
        "top_logprobs": 0,
        "top_p": request.sampling.top_p,
        "presence_penalty": request.sampling.presence_penalty,
        "frequency_penalty": request.sampling.frequency_penalty,
        "truncation": req.truncation or "disabled",
        "user": req.user,
        "safety_identifier": req.safety_identifier,
        "prompt_cache_key": req.prompt_cache_key,
        "metadata": req.metadata or {},
    }
