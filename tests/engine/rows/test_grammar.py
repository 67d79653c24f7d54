"""Tier 1: llguidance matchers over SmolLM2's real tokenizer, and the grammars the protocols build.

No model weights: the tokenizer alone decides which token ids a grammar allows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.rows.grammar import Constraint, GrammarTokenizer
from mlx_serve.protocols import structured

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"$ref": "#/$defs/City"}},
            "required": ["city"],
            "$defs": {"City": {"enum": ["Paris", "Rome"]}},
        },
    },
}
NOW: Any = {"type": "function", "function": {"name": "now"}}


@pytest.fixture(scope="module")
def tokenizer(smollm_path: Path) -> Any:
    from mlx_serve.engine.model.loader import ModelSpec, load_tokenizer

    return load_tokenizer(ModelSpec(smollm_path, "smollm"))


@pytest.fixture(scope="module")
def grammars(tokenizer: Any) -> GrammarTokenizer:
    return GrammarTokenizer(tokenizer)


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def follows(grammars: GrammarTokenizer, tokenizer: Any, grammar: str, text: str) -> bool:
    """Whether `text`, tokenized as the model would write it, is a complete sentence of `grammar`."""
    c = grammars.constraint(grammar)
    return all(c.consume(t) for t in ids(tokenizer, text)) and c.matcher.is_accepting()


def allowed_text(c: Constraint, tokenizer: Any) -> set[str]:
    return {tokenizer.decode([int(i)]) for i in np.flatnonzero(c.allowed())}


def test_constraint_masks_all_but_the_grammars_tokens(grammars: GrammarTokenizer, tokenizer: Any) -> None:
    c = grammars.constraint(structured.choice(["yes", "no"], "p"))
    logits = mx.zeros((1, c.vocab_size))
    masked = np.array(c.apply(logits))[0]
    kept = {tokenizer.decode([int(i)]) for i in np.flatnonzero(np.isfinite(masked))}
    assert kept and kept <= {"y", "ye", "yes", "n", "no"} and {"yes", "no"} <= kept
    assert masked[np.isfinite(masked)].max() == 0.0  # allowed logits pass through unchanged


def test_constraint_done_allows_only_eos(grammars: GrammarTokenizer, tokenizer: Any) -> None:
    c = grammars.constraint(structured.choice(["yes", "no"], "p"))
    assert not c.is_done()
    assert all(c.consume(t) for t in ids(tokenizer, "yes"))
    assert c.is_done()
    assert set(np.flatnonzero(c.allowed())) == set(tokenizer.eos_token_ids)


def test_constraint_refuses_a_token_outside_the_grammar(grammars: GrammarTokenizer, tokenizer: Any) -> None:
    c = grammars.constraint(structured.regex(r"[0-9]+", "p"))
    assert c.consume(ids(tokenizer, "7")[0])
    assert not c.consume(ids(tokenizer, "x")[0])
    assert c.error is not None and "doesn't satisfy the grammar" in c.error
    assert c.is_done() and set(np.flatnonzero(c.allowed())) == set(tokenizer.eos_token_ids)


def test_constraint_rollback_and_validate_for_draft_tokens(
    grammars: GrammarTokenizer, tokenizer: Any
) -> None:
    c = grammars.constraint(
        structured.json_schema(
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "required": ["a"],
                "additionalProperties": False,
            },
            "p",
        )
    )
    draft = ids(tokenizer, '{"a": 12}')
    bad = ids(tokenizer, '{"b')
    assert c.validate(draft) == len(draft) and c.validate(bad) < len(bad)
    before = c.allowed()
    assert all(c.consume(t) for t in draft[:3])
    c.rollback(3)
    assert np.array_equal(c.allowed(), before)
    assert all(c.consume(t) for t in draft) and c.is_done()


def test_constraint_as_processor_consumes_the_previous_token(
    grammars: GrammarTokenizer, tokenizer: Any
) -> None:
    """mlx-lm calls it once per step; the first call (first generated token) consumes nothing."""
    c = grammars.constraint(structured.choice(["yes", "no"], "p"))
    logits = mx.zeros((1, c.vocab_size))
    prompt = mx.array(ids(tokenizer, "Answer:"))
    first = c(prompt, logits)  # the context ends with the prompt: nothing to consume yet
    assert "yes" in {tokenizer.decode([int(i)]) for i in np.flatnonzero(np.isfinite(np.array(first)[0]))}
    yes = ids(tokenizer, "yes")
    assert len(yes) == 1
    c(mx.concatenate([prompt, mx.array(yes)]), logits)
    assert c.is_done()


def test_constraint_pads_a_vocabulary_wider_than_the_tokenizers(grammars: GrammarTokenizer) -> None:
    c = grammars.constraint(structured.regex(r"a", "p"))
    masked = np.array(c.apply(mx.zeros((1, c.vocab_size + 64))))[0]
    assert masked.shape == (c.vocab_size + 64,) and np.all(masked[c.vocab_size :] == -np.inf)


def test_grammar_tokenizer_refuses_an_unknown_special_token(grammars: GrammarTokenizer) -> None:
    grammar = structured.grammar("start: <|no_such_token|>", "p")  # fine without a tokenizer
    with pytest.raises(InvalidRequest) as info:
        grammars.constraint(grammar)
    assert "unknown special token" in info.value.message


def test_json_comes_out_on_one_line(grammars: GrammarTokenizer, tokenizer: Any) -> None:
    g = structured.json_schema({"type": "object", "properties": {"a": {"type": "array"}}}, "p")
    assert follows(grammars, tokenizer, g, '{"a": [1, 2]}')
    assert not follows(grammars, tokenizer, g, '{\n  "a": [1, 2]\n}')
    assert not follows(grammars, tokenizer, g, "[1]")  # None is any JSON *object*
    flexible = {"type": "object", "x-guidance": {"whitespace_flexible": True}}
    assert follows(grammars, tokenizer, structured.json_schema(flexible, "p"), '{\n  "a": 1\n}')


def test_regex_choice_and_lark_grammars(grammars: GrammarTokenizer, tokenizer: Any) -> None:
    assert follows(grammars, tokenizer, structured.regex(r"\d{3}-[a-z]+", "p"), "123-abc")
    assert not follows(grammars, tokenizer, structured.regex(r"\d{3}-[a-z]+", "p"), "12-abc")
    assert follows(grammars, tokenizer, structured.choice(["red", "green"], "p"), "green")
    assert not follows(grammars, tokenizer, structured.choice(["red", "green"], "p"), "blue")
    quoted = structured.choice(['say "hi"', "café\n"], "p")
    assert follows(grammars, tokenizer, quoted, 'say "hi"') and follows(grammars, tokenizer, quoted, "café\n")
    lark = 'start: "x=" NUM ";"\nNUM: /[0-9]+/'
    assert follows(grammars, tokenizer, structured.grammar(lark, "p"), "x=42;")
    gbnf = 'root ::= "x=" [0-9]+ ";"'
    assert follows(grammars, tokenizer, structured.grammar(gbnf, "p"), "x=42;")


def call(name: str, arguments: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def test_forced_call_names_are_written_as_a_model_writes_them(
    grammars: GrammarTokenizer, tokenizer: Any
) -> None:
    tool = {"function": {"name": "météo", "parameters": {"type": "object"}}}
    g = structured.forced_calls([tool], "météo", False, False)
    assert g is not None and follows(grammars, tokenizer, g, call("météo", {}))


def test_forced_call_grammar_is_one_call_with_valid_arguments(
    grammars: GrammarTokenizer, tokenizer: Any
) -> None:
    named = structured.forced_calls([WEATHER, NOW], "get_weather", False, True)
    assert named is not None
    assert follows(grammars, tokenizer, named, call("get_weather", {"city": "Rome"}))
    assert not follows(grammars, tokenizer, named, call("get_weather", {"city": "Oslo"}))
    assert not follows(grammars, tokenizer, named, call("now", {}))
    assert not follows(grammars, tokenizer, named, "Sure! " + call("get_weather", {"city": "Rome"}))
    two = call("get_weather", {"city": "Rome"}) + call("now", {})
    assert not follows(grammars, tokenizer, named, two)


def test_required_call_grammar_is_any_tool_and_parallel_when_allowed(
    grammars: GrammarTokenizer, tokenizer: Any
) -> None:
    two = call("get_weather", {"city": "Rome"}) + call("now", {})
    parallel = structured.forced_calls([WEATHER, NOW], None, True, True)
    single = structured.forced_calls([WEATHER, NOW], None, True, False)
    assert parallel is not None and single is not None
    assert follows(grammars, tokenizer, parallel, two)
    assert follows(grammars, tokenizer, single, call("now", {}))
    assert not follows(grammars, tokenizer, single, two)
    assert not follows(grammars, tokenizer, single, call("now", {"x": 1}))  # no parameters: {}
