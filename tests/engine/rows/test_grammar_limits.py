"""Tier 1 (SmolLM2's real tokenizer, no weights): grammars that compile yet cannot be followed
are found before a row follows them, and one that fails while decoding fails its row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from llguidance import LLMatcher

from mlx_serve.engine.rows.grammar import GrammarFailed, GrammarTokenizer

CYCLE = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}


def wide_choice(n: int) -> str:
    return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(f"item {i}") for i in range(n)))


@pytest.fixture(scope="module")
def grammars(smollm_path: Path) -> GrammarTokenizer:
    from mlx_serve.engine.model.loader import ModelSpec, load_tokenizer

    tokenizer: Any = load_tokenizer(ModelSpec(smollm_path, "smollm"))
    return GrammarTokenizer(tokenizer)


UNFOLLOWABLE = {
    "lark-start-start": LLMatcher.grammar_from_lark("start: start"),
    "json-schema-ref-cycle": LLMatcher.grammar_from_json_schema(json.dumps(CYCLE)),
    "regex-past-lexer-limits": LLMatcher.grammar_from_regex("(.{0,1000}){1000}"),
    "choice-wider-than-a-parser-row": wide_choice(2500),
}


@pytest.mark.parametrize("grammar", UNFOLLOWABLE.values(), ids=UNFOLLOWABLE.keys())
def test_dry_run_names_why_a_compiled_grammar_cannot_be_followed(
    grammars: GrammarTokenizer, grammar: str
) -> None:
    assert LLMatcher.validate_grammar(grammar) == ""  # each compiles: only the walk finds it
    why = grammars.dry_run(grammar)
    assert why, "the walk found nothing wrong"
    assert "<state>" not in why and "\n" not in why and len(why) <= 300


@pytest.mark.parametrize(
    "grammar",
    [LLMatcher.grammar_from_regex("[a-z]{1,8}"), wide_choice(100), LLMatcher.grammar_from_lark('start: "x"')],
)
def test_dry_run_passes_grammars_a_row_can_follow(grammars: GrammarTokenizer, grammar: str) -> None:
    assert grammars.dry_run(grammar) is None


def test_a_grammar_failing_mid_decode_fails_its_row_instead_of_stopping(grammars: GrammarTokenizer) -> None:
    constraint = grammars.constraint(wide_choice(2500))
    logits = mx.zeros((grammars.ll.vocab_size,))
    first = constraint(mx.array([1]), logits)  # the first token's mask: nothing consumed yet
    token = int(mx.argmax(first).item())
    with pytest.raises(GrammarFailed, match="during decoding"):
        constraint(mx.array([1, token]), logits)


def test_grammar_message_drops_a_rust_panic_backtrace_and_the_parser_state() -> None:
    from mlx_serve.engine.errors import grammar_message

    panic = "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n<backtrace>\n   0: <unknown>\n"
    assert grammar_message(panic) == "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10"
    assert grammar_message("NoExtensionBias\n<state>\nTokens: ⟦⟧") == "no text can match it"
    assert len(grammar_message("x" * 10_000)) == 300
