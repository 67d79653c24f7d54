"""Ollama's API: POST /api/chat and POST /api/generate (the model facts its clients read,
/api/tags, /api/show, /api/ps and /api/version, are in `ollama_facts`).

Ollama streams by default (`stream` absent is true), one JSON object a line (NDJSON); its
sampling lives in `options`, its limits are `num_predict` (absent or negative: up to the
context) and `num_ctx` (a clamp on prompt + answer here: the model's own context is fixed at
load). Options that change nothing here (threads, GPU layers, mirostat, ...) are served without
and named in a `Warning` header, as is `keep_alive` (the server's --idle-unload-s decides). Messages become
the same template dicts `openai_chat` renders, so one conversation is one prompt on every
wire format, and greedy output equals the OpenAI route's.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from mlx_serve.engine.errors import InvalidRequest, ServeError
from mlx_serve.engine.types import Request
from mlx_serve.protocols import conversation as conv
from mlx_serve.protocols import ollama_render as render
from mlx_serve.protocols import openai_common as common
from mlx_serve.protocols import structured
from mlx_serve.protocols.contract import Framing, Job, ProtocolContext, Result
from mlx_serve.protocols.ollama_render import OllamaJob

ID_PREFIX = "ollama"
LATEST = ":latest"
Think = bool | Literal["high", "medium", "low"]
# What validation's 400s call the engine fields Ollama names differently.
CHAT_NAMES = {"prompt_tokens": "messages", "max_tokens": "options.num_predict", "stop": "options.stop"}
GENERATE_NAMES = {**CHAT_NAMES, "prompt_tokens": "prompt"}
# Options that would change nothing here: accepted, and named in a Warning.
RUNNER_OPTIONS = frozenset(
    {"numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "f16_kv", "logits_all", "vocab_only"}
    | {"use_mmap", "use_mlock", "embedding_only", "num_thread", "num_keep", "penalize_newline"}
    | {"typical_p", "tfs_z", "mirostat", "mirostat_tau", "mirostat_eta"}
)


class Options(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The `options` this server honours."""

    temperature: Annotated[float, Meta(ge=0)] | None = None
    top_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    num_predict: Annotated[int, Meta(ge=-2)] | None = None
    num_ctx: Annotated[int, Meta(ge=1)] | None = None
    stop: common.StopString | common.StopList | None = None
    seed: int | None = None
    repeat_penalty: Annotated[float, Meta(ge=0)] | None = None
    repeat_last_n: Annotated[int, Meta(ge=0)] | None = None
    presence_penalty: common.Penalty | None = None
    frequency_penalty: common.Penalty | None = None


class CallFunction(Struct, frozen=True):
    name: str
    arguments: dict[str, Any] | str = msgspec.field(default_factory=dict)
    index: int | None = None


class CallIn(Struct, frozen=True):
    function: CallFunction
    id: str | None = None
    type: str | None = None


class MessageIn(Struct, frozen=True):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | None = None
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[CallIn] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionDef(Struct, frozen=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(Struct, frozen=True):
    function: FunctionDef
    type: Literal["function"] = "function"


class Common(Struct, frozen=True, kw_only=True):
    """What /api/chat and /api/generate share."""

    model: str = ""
    stream: bool = True
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    keep_alive: str | float | None = None
    think: Think | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Meta(ge=0, le=common.MAX_TOP_LOGPROBS)] | None = None


class ChatBody(Common, frozen=True, kw_only=True):
    messages: list[MessageIn] = msgspec.field(default_factory=list)
    tools: list[Tool] | None = None


class GenerateBody(Common, frozen=True, kw_only=True):
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    context: list[int] | None = None
    suffix: str | None = None
    template: str | None = None
    images: list[str] | None = None


CHAT_DECODER = msgspec.json.Decoder(ChatBody)
GENERATE_DECODER = msgspec.json.Decoder(GenerateBody)


def parse_chat(body: bytes, ctx: ProtocolContext) -> OllamaJob:
    req = common.decode(CHAT_DECODER, body)
    if not req.messages:
        return _load_job(req, chat=True)
    messages = [_template_message(m, i) for i, m in enumerate(req.messages)]
    tools = [msgspec.to_builtins(t) for t in req.tools] if req.tools else None
    ids = conv.render_prompt(ctx, messages, tools, _think_kwargs(req.think), "messages")
    return _job(req, ids, ctx, tools, chat=True)


def parse_generate(body: bytes, ctx: ProtocolContext) -> OllamaJob:
    req = common.decode(GENERATE_DECODER, body)
    _refuse_generate_fields(req)
    if not req.prompt and not req.context:
        return _load_job(req, chat=False)
    if req.raw:
        ids = ctx.tokenizer.encode(req.prompt) if req.prompt else []
    else:
        system = [{"role": "system", "content": req.system}] if req.system else []
        messages = [*system, {"role": "user", "content": req.prompt}]
        ids = conv.render_prompt(ctx, messages, None, _think_kwargs(req.think), "prompt")
    return _job(req, [*(req.context or ()), *ids], ctx, None, chat=False)


def _refuse_generate_fields(req: GenerateBody) -> None:
    if req.suffix:
        raise InvalidRequest("`suffix` (fill-in-the-middle) is not supported", param="suffix")
    if req.template:
        raise InvalidRequest(
            "`template` is not supported: prompts use the model's own chat template (or send `raw`)",
            param="template",
        )
    if req.images:
        raise InvalidRequest("this model has no vision input", param="images")


def _think_kwargs(think: Think | None) -> dict[str, Any]:
    return conv.thinking_kwargs(None if think is None else think is not False)


def _template_message(msg: MessageIn, index: int) -> dict[str, Any]:
    if msg.images:
        raise InvalidRequest("this model has no vision input", param=f"messages[{index}].images")
    role = "system" if msg.role == "developer" else msg.role
    out: dict[str, Any] = {"role": role, "content": msg.content or ""}
    if msg.tool_calls:
        out["tool_calls"] = [_template_call(c, index, j) for j, c in enumerate(msg.tool_calls)]
    if msg.thinking:
        out["reasoning_content"] = msg.thinking
    name = msg.tool_name or msg.name
    if name is not None:
        out["name"] = name
    if msg.tool_call_id is not None:
        out["tool_call_id"] = msg.tool_call_id
    return out


def _template_call(call: CallIn, index: int, j: int) -> dict[str, Any]:
    args = call.function.arguments
    if isinstance(args, str):
        args = conv.parse_arguments(args, f"messages[{index}].tool_calls[{j}].function.arguments")
    return conv.tool_call(call.id, call.function.name, args)


def _job(
    req: ChatBody | GenerateBody,
    ids: list[int],
    ctx: ProtocolContext,
    tools: list[dict[str, Any]] | None,
    chat: bool,
) -> OllamaJob:
    options, ignored = _options(req.options)
    max_tokens = _max_tokens(options, len(ids), ctx)
    sampling = conv.sampling(
        ctx,
        temperature=options.temperature,
        top_p=options.top_p,
        top_k=options.top_k,
        min_p=options.min_p,
        seed=options.seed,
        repetition_penalty=options.repeat_penalty,
        repetition_context_size=options.repeat_last_n,
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
    )
    request = Request(
        id=f"{ID_PREFIX}-{uuid.uuid4().hex}",
        prompt_tokens=tuple(ids),
        sampling=sampling,
        max_tokens=max_tokens,
        stop=common.stop_strings(options.stop),
        tools=tuple(tools) if tools else None,
        logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        grammar=_format_grammar(req.format),
    )
    warnings = _warnings(req, ignored) + conv.tool_support_warnings(ctx, tools)
    return _ollama_job(req, request, chat, warnings)


def _ollama_job(
    req: Common, request: Request, chat: bool, warnings: tuple[str, ...] = (), answer: bytes | None = None
) -> OllamaJob:
    return OllamaJob(
        request,
        stream=req.stream,
        model=req.model.removesuffix(LATEST),
        warnings=warnings,
        framing=Framing.NDJSON,
        answer=answer,
        chat=chat,
        echo=req.model,
        arrived=time.time(),
    )


def _load_job(req: Common, chat: bool) -> OllamaJob:
    """No prompt: Ollama's way to load a model. Ours is loaded: done at once, `done_reason` load."""
    request = Request(id=f"{ID_PREFIX}-{uuid.uuid4().hex}", prompt_tokens=())
    return _ollama_job(req, request, chat, answer=render.loaded(_ollama_job(req, request, chat)))


def _options(raw: dict[str, Any] | None) -> tuple[Options, list[str]]:
    """The options we honour, and the names of those that change nothing here."""
    given = {k: v for k, v in (raw or {}).items() if v is not None}
    ignored = sorted(k for k in given if k in RUNNER_OPTIONS)
    unknown = sorted(k for k in given if k not in RUNNER_OPTIONS and k not in Options.__struct_fields__)
    known = {k: v for k, v in given.items() if k in Options.__struct_fields__}
    try:
        options = msgspec.convert(known, Options)
    except msgspec.ValidationError as exc:
        raise common.invalid_at(exc, "options") from exc
    return options, ignored + unknown


def _max_tokens(options: Options, prompt_tokens: int, ctx: ProtocolContext) -> int:
    """num_predict (absent, -1 or -2: up to the context), within num_ctx when it is given."""
    if options.num_predict == 0:
        raise InvalidRequest(
            "`options.num_predict` must be at least 1, or -1 (no limit) or -2 (fill the context)",
            param="options.num_predict",
        )
    wanted = options.num_predict if options.num_predict and options.num_predict > 0 else None
    limit = wanted or ctx.room_after(prompt_tokens)
    if options.num_ctx is None:
        return limit
    if prompt_tokens >= options.num_ctx:
        raise InvalidRequest(
            f"the prompt holds {prompt_tokens} tokens, no fewer than `options.num_ctx` ({options.num_ctx}); "
            "raise num_ctx or shorten the prompt",
            param="options.num_ctx",
        )
    return min(limit, options.num_ctx - prompt_tokens)


def _format_grammar(fmt: str | dict[str, Any] | None) -> str | None:
    if not fmt:
        return None
    return structured.json_schema(structured.ANY_OBJECT if fmt == "json" else fmt, "format")


def _warnings(req: Common, ignored: list[str]) -> tuple[str, ...]:
    notes: list[str] = []
    if ignored:
        notes.append(
            conv.warning(f"options not used by this server (served without them): {', '.join(ignored)}")
        )
    if req.keep_alive is not None:
        notes.append(
            conv.warning(
                "keep_alive has no effect here: how long a model stays loaded is the server's "
                "--idle-unload-s (by default, for as long as the server runs)"
            )
        )
    return tuple(notes)


class OllamaFormat:
    """The WireFormat of POST /api/chat (`chat`) or POST /api/generate."""

    def __init__(self, chat: bool) -> None:
        self._parse = parse_chat if chat else parse_generate

    def parse(self, body: bytes, ctx: ProtocolContext) -> Job:
        return self._parse(body, ctx)

    def renderer(self, job: Job, ctx: ProtocolContext) -> render.OllamaStream:
        return render.OllamaStream(render.own(job))

    def to_json(self, job: Job, results: list[Result], ctx: ProtocolContext) -> bytes:
        return render.to_json(job, results, ctx)

    def error_body(self, exc: ServeError) -> bytes:
        return render.error_body(exc)


CHAT = OllamaFormat(chat=True)
GENERATE = OllamaFormat(chat=False)
