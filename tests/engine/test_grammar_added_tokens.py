"""Grammars over a vocabulary with non-special added tokens: Qwen2.5's `<tool_call>` (id 151657).

The tokenizer alone (no weights) of the real Qwen2.5-Coder-0.5B-Instruct.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from mlx_serve.engine.model.loader import load_tokenizer, prepare
from mlx_serve.engine.rows.grammar import GrammarTokenizer
from mlx_serve.protocols import structured

pytestmark = pytest.mark.real

TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]  # fmt: skip
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(prepare("qwen2.5-coder-0.5b"))


@pytest.fixture(scope="module")
def grammars(tokenizer: Any) -> GrammarTokenizer:
    return GrammarTokenizer(tokenizer)


def test_forced_tool_call_accepts_the_added_token_and_its_pieces(
    grammars: GrammarTokenizer, tokenizer: Any
) -> None:
    grammar = structured.forced_calls(TOOLS, None, required=True, parallel=False)
    assert grammar is not None
    whole = list(tokenizer.encode(CALL, add_special_tokens=False))  # as the model's tokenizer writes it
    pieces = grammars.ll.tokenize_str(CALL)  # "<", "tool", "_call", ">", … as BPE alone writes it
    assert whole[0] == 151657 and 151657 not in pieces
    assert tokenizer.decode(whole) == tokenizer.decode(pieces) == CALL

    for written in (whole, pieces):
        c = grammars.constraint(grammar)
        assert all(c.consume(t) for t in written), c.error
        assert c.is_done()


def test_forced_tool_call_first_token_is_one_the_grammar_then_takes(grammars: GrammarTokenizer) -> None:
    grammar = structured.forced_calls(TOOLS, "get_weather", required=False, parallel=False)
    assert grammar is not None
    c = grammars.constraint(grammar)

    for token in np.flatnonzero(c.allowed())[:50]:
        probe = grammars.constraint(grammar)
        assert probe.consume(int(token)), probe.error


def test_grammar_view_keeps_every_id_and_the_special_tokens(
    grammars: GrammarTokenizer, tokenizer: Any
) -> None:
    assert grammars.ll.vocab_size == len(tokenizer.get_vocab()) == 151936
    assert grammars.ll.decode_str([151657]) == "<tool_call>"  # plain text now
    assert grammars.ll.is_special_token(151645)  # <|im_end|> stays special
