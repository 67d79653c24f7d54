"""POST /tokenize, /detokenize, /apply-template and the input-token counts: llama.cpp's and
vLLM's request shapes, and counts made by each generation route's own parser."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from mlx_serve.protocols import openai_chat, token_tools
from mlx_serve.protocols.contract import ProtocolContext
from tests.protocols.conftest import FakeTokenizer

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def call(fn: token_tools.AnswerFn, ctx: ProtocolContext, **body: Any) -> tuple[int, Any]:
    status, out = fn(orjson.dumps(body), ctx)
    return status, orjson.loads(out)


class SpecialTokenizer(FakeTokenizer):
    """Adds a BOS (id 1) where the tokenizer's config says special tokens are added."""

    def encode(self, text: str) -> list[int]:
        return [1, *self.encode_continuation(text)]

    def encode_continuation(self, text: str) -> list[int]:
        return [ord(ch) % self.vocab_size for ch in text]

    def decode(self, ids: list[int]) -> str:
        return "".join("<s>" if i == 1 else chr(i) for i in ids)


@pytest.fixture
def special(ctx: ProtocolContext) -> ProtocolContext:
    return replace(ctx, tokenizer=SpecialTokenizer(), context_length=4096)  # type: ignore[arg-type]


def test_llama_cpp_content_adds_no_special_tokens_unless_asked(special: ProtocolContext) -> None:
    assert call(token_tools.tokenize, special, content="hi")[1]["tokens"] == [104, 105]
    assert call(token_tools.tokenize, special, content="hi", add_special=True)[1]["tokens"] == [1, 104, 105]


def test_vllm_prompt_adds_special_tokens_unless_told_not_to(special: ProtocolContext) -> None:
    status, out = call(token_tools.tokenize, special, prompt="hi")
    assert status == 200 and out == {"tokens": [1, 104, 105], "count": 3, "max_model_len": 4096}
    assert call(token_tools.tokenize, special, prompt="hi", add_special_tokens=False)[1]["count"] == 2


def test_with_pieces_gives_each_tokens_text(special: ProtocolContext) -> None:
    out = call(token_tools.tokenize, special, content="hi", with_pieces=True)[1]
    assert out["tokens"] == [{"id": 104, "piece": "h"}, {"id": 105, "piece": "i"}]


def test_messages_are_tokenized_by_the_chat_parser(ctx: ProtocolContext) -> None:
    want = openai_chat.FORMAT.parse(orjson.dumps(CHAT), ctx).request.prompt_tokens
    assert call(token_tools.tokenize, ctx, **CHAT)[1]["tokens"] == list(want)
    status, out = call(token_tools.tokenize, ctx, **CHAT, add_generation_prompt=False)
    assert status == 400 and out["error"]["param"] == "add_generation_prompt"


def test_tokenize_needs_text(ctx: ProtocolContext) -> None:
    status, out = call(token_tools.tokenize, ctx)
    assert status == 400 and out["error"]["param"] == "content"
    status, out = call(token_tools.tokenize, ctx, content="a", prompt="b")
    assert status == 400 and out["error"]["type"] == "invalid_request_error"


def test_detokenize_answers_in_both_names_and_checks_ids(special: ProtocolContext) -> None:
    assert call(token_tools.detokenize, special, tokens=[104, 105]) == (
        200,
        {"content": "hi", "prompt": "hi"},
    )
    status, out = call(token_tools.detokenize, special, tokens=[104, 5000])
    assert status == 400 and out["error"]["param"] == "tokens[1]"
    assert call(token_tools.detokenize, special, tokens="x")[0] == 400


def test_apply_template_is_the_chat_prompt_as_text(special: ProtocolContext) -> None:
    tokenizer = special.tokenizer
    ids = openai_chat.FORMAT.parse(orjson.dumps(CHAT), special).request.prompt_tokens
    assert call(token_tools.apply_template, special, **CHAT) == (200, {"prompt": tokenizer.decode(list(ids))})


def test_input_tokens_count_what_the_route_would_prompt(ctx: ProtocolContext) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for body in (CHAT, {**CHAT, "tools": tools}):
        want = len(openai_chat.FORMAT.parse(orjson.dumps(body), ctx).request.prompt_tokens)
        out = call(token_tools.chat_input_tokens, ctx, **body)
        assert out == (200, {"object": "chat.completion.input_tokens", "input_tokens": want})
    status, out = call(token_tools.chat_input_tokens, ctx, model="m", messages=[])
    assert status == 400 and out["error"]["param"] == "messages"


def test_a_model_not_served_is_a_404_as_on_the_generation_routes(special: ProtocolContext) -> None:
    served = replace(special, accepts=lambda name: name == "m", listed=("m",))
    for fn, body in (
        (token_tools.chat_input_tokens, CHAT),
        (token_tools.tokenize, {"model": "m", "content": "hi"}),
        (token_tools.detokenize, {"model": "m", "tokens": [104]}),
        (token_tools.apply_template, CHAT),
    ):
        assert call(fn, served, **body)[0] == 200
        status, out = call(fn, served, **{**body, "model": "other"})
        assert (
            status == 404 and out["error"]["code"] == "model_not_found" and out["error"]["param"] == "model"
        )


def test_token_bytes_read_byte_level_and_byte_fallback_spellings() -> None:
    assert token_tools._token_bytes("ðŁ") == "🙂".encode()[:2]
    assert token_tools._token_bytes("Ġæ") == b" " + "日".encode()[:1]
    assert token_tools._token_bytes("<0xE6>") == b"\xe6"
    assert token_tools._token_bytes("▁hello") is None
