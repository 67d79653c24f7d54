"""Token tools: POST /tokenize, /detokenize, /apply-template, and input-token counts in OpenAI's
shape (POST /v1/responses/input_tokens, /v1/chat/completions/input_tokens).

Both llama.cpp's shapes (`content`, `add_special`, `with_pieces`; `{"tokens": [...]}` back) and
vLLM's (`prompt` or `messages`, `add_special_tokens`, `return_token_strs`; `count` and
`max_model_len` back) are read. A chat body is parsed by the chat route's own parser, and an
input count by its route's, so each count is the `prompt_tokens` a generation with the same
body reports, exactly. Each function answers `(status, body)`, errors in OpenAI's envelope.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec
import orjson
from msgspec import Struct

from mlx_serve.engine.errors import InvalidRequest, ServeError
from mlx_serve.protocols import openai_chat
from mlx_serve.protocols import openai_common as common
from mlx_serve.protocols.contract import ModelNotFound, ProtocolContext, WireFormat
from mlx_serve.protocols.openai_render import error_body

Answer = tuple[int, bytes]
AnswerFn = Callable[[bytes, ProtocolContext], Answer]


class TokenizeBody(Struct, frozen=True, kw_only=True):
    """What /tokenize reads itself; a body with `messages` is read by the chat parser."""

    model: str | None = None
    content: str | None = None  # llama.cpp
    prompt: str | None = None  # vLLM
    messages: list[Any] | None = None
    add_special: bool | None = None  # llama.cpp (default false)
    add_special_tokens: bool | None = None  # vLLM (default true for text)
    with_pieces: bool = False
    return_token_strs: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class DetokenizeBody(Struct, frozen=True, kw_only=True):
    tokens: list[int]
    model: str | None = None


TOKENIZE_DECODER = msgspec.json.Decoder(TokenizeBody)
DETOKENIZE_DECODER = msgspec.json.Decoder(DetokenizeBody)


def answering(
    fn: Callable[[bytes, ProtocolContext], dict[str, Any]],
) -> AnswerFn:
    """`fn`'s body as a 200, or its ServeError in OpenAI's envelope."""

    def answer(body: bytes, ctx: ProtocolContext) -> Answer:
        try:
            return 200, orjson.dumps(fn(body, ctx))
        except ServeError as exc:
            return exc.status, error_body(exc)

    return answer


def _check_model(name: str | None, ctx: ProtocolContext) -> None:
    """A model the generation routes would refuse is refused here too (404)."""
    if name and ctx.accepts is not None and not ctx.accepts(name):
        raise ModelNotFound(
            f"model '{name}' is not served here; use one of: {', '.join(ctx.listed)}", param="model"
        )


def _tokenize(body: bytes, ctx: ProtocolContext) -> dict[str, Any]:
    req = common.decode(TOKENIZE_DECODER, body)
    _check_model(req.model, ctx)
    ids = _chat_ids(req, body, ctx) if req.messages is not None else _text_ids(req, ctx)
    out: dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": ctx.context_length}
    if req.with_pieces:
        out["tokens"] = [{"id": i, "piece": _piece(i, ctx)} for i in ids]
    if req.return_token_strs:
        out["token_strs"] = _token_strs(ids, ctx)
    return out


def _chat_ids(req: TokenizeBody, body: bytes, ctx: ProtocolContext) -> list[int]:
    if not req.add_generation_prompt:
        raise InvalidRequest("`add_generation_prompt: false` is not supported", param="add_generation_prompt")
    if req.continue_final_message:
        raise InvalidRequest("`continue_final_message` is not supported", param="continue_final_message")
    return list(openai_chat.FORMAT.parse(body, ctx).request.prompt_tokens)


def _text_ids(req: TokenizeBody, ctx: ProtocolContext) -> list[int]:
    if req.content is not None and req.prompt is not None:
        raise InvalidRequest("give `content` or `prompt`, not both", param="prompt")
    text = req.content if req.content is not None else req.prompt
    if text is None:
        raise InvalidRequest(
            "give the text as `content` (or `prompt`), or a chat as `messages`", param="content"
        )
    # llama.cpp adds no special tokens unless asked; vLLM adds them unless told not to.
    special = req.add_special if req.add_special is not None else req.add_special_tokens
    if special is None:
        special = req.content is None
    if not text:
        return []
    return ctx.tokenizer.encode(text) if special else ctx.tokenizer.encode_continuation(text)


def _piece(token: int, ctx: ProtocolContext) -> str | list[int]:
    """The token's text, or (as llama.cpp) its bytes when they are not whole UTF-8 characters."""
    text = ctx.tokenizer.decode([token])
    if "\ufffd" not in text:
        return text
    raw = _token_bytes(_token_strs([token], ctx)[0])
    if raw is None:
        return text
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return list(raw)


def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's spelling of bytes as characters (GPT-2's table), reversed."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [b for b in range(256) if b not in kept]
    table = {chr(b): b for b in kept}
    table.update({chr(256 + n): b for n, b in enumerate(shifted)})
    return table


BYTE_DECODER = _byte_decoder()
BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


def _token_bytes(spelled: str) -> bytes | None:
    if (found := BYTE_TOKEN.fullmatch(spelled)) is not None:
        return bytes([int(found[1], 16)])
    if spelled and all(ch in BYTE_DECODER for ch in spelled):
        return bytes(BYTE_DECODER[ch] for ch in spelled)
    return None


def _token_strs(ids: list[int], ctx: ProtocolContext) -> list[str]:
    convert = getattr(ctx.tokenizer.wrapper, "convert_ids_to_tokens", None)
    if convert is None:
        return [ctx.tokenizer.decode([i]) for i in ids]
    return [str(t) for t in convert(ids)]


def _detokenize(body: bytes, ctx: ProtocolContext) -> dict[str, Any]:
    req = common.decode(DETOKENIZE_DECODER, body)
    _check_model(req.model, ctx)
    vocab = ctx.tokenizer.vocab_size
    for i, token in enumerate(req.tokens):
        if not 0 <= token < vocab:
            raise InvalidRequest(
                f"token {token} is not a token id of this model (0..{vocab - 1})", param=f"tokens[{i}]"
            )
    text = ctx.tokenizer.decode(req.tokens)
    return {"content": text, "prompt": text}  # llama.cpp's name, vLLM's name


def _apply_template(body: bytes, ctx: ProtocolContext) -> dict[str, Any]:
    """The chat body's prompt as text: the very tokens a generation would start from, decoded."""
    job = openai_chat.FORMAT.parse(body, ctx)
    _check_model(job.model, ctx)
    return {"prompt": ctx.tokenizer.decode(list(job.request.prompt_tokens))}


tokenize = answering(_tokenize)
detokenize = answering(_detokenize)
apply_template = answering(_apply_template)


def input_tokens(fmt: WireFormat, obj: str) -> AnswerFn:
    """The prompt tokens a `fmt` generation with this body would report, as `{object, input_tokens}`."""

    def count(body: bytes, ctx: ProtocolContext) -> dict[str, Any]:
        job = fmt.parse(body, ctx)
        _check_model(job.model, ctx)
        return {"object": obj, "input_tokens": len(job.request.prompt_tokens)}

    return answering(count)


chat_input_tokens = input_tokens(openai_chat.FORMAT, "chat.completion.input_tokens")
