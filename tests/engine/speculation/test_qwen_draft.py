"""A real draft model: Qwen2.5-Coder-0.5B-Instruct drafting for Qwen2.5-Coder-1.5B-Instruct.

Both float32 (as the server runs them on a CPU), the gate off so every step speculates: greedy
output with the draft must equal mlx-lm's plain greedy output token for token. One short
code-editing request: the 1.5B decodes at 1-2 tok/s on 2 cores, so this costs about a minute.
"""

from __future__ import annotations

from typing import Any

import pytest

from mlx_serve.engine.host.assemble import check_draft_tokenizer, load_draft
from mlx_serve.engine.model.loader import LoadedModel, load_model, prepare
from mlx_serve.engine.speculation.rows import Speculation
from mlx_serve.engine.types import Request, SamplingParams
from tests.engine.batch.test_runner import prompt_ids, reference
from tests.engine.speculation.test_speculation import run_batch

pytestmark = pytest.mark.real

CODE = """def mean(values):
    total = 0
    for v in values:
        total += v
    return total / len(values)
"""
EDIT = f"Rename the function to `average` and keep everything else:\n```python\n{CODE}```"
TOKENS = 32


@pytest.fixture(scope="module")
def pair() -> tuple[LoadedModel, LoadedModel]:
    target = load_model(prepare("qwen2.5-coder-1.5b", dequantize="always"))
    draft = load_draft(target, prepare("qwen2.5-coder-0.5b", dequantize="always"), k=3)
    return target, draft


def test_the_pair_shares_one_tokenizer(pair: tuple[LoadedModel, LoadedModel]) -> None:
    target, draft = pair
    check_draft_tokenizer(target.tokenizer, draft.tokenizer, draft.model_id)  # raises if not

    assert len(target.tokenizer.get_vocab()) == 151936
    assert target.model.model.embed_tokens.weight.shape[0] == draft.model.model.embed_tokens.weight.shape[0]


def test_greedy_with_the_draft_model_equals_plain_greedy(pair: tuple[LoadedModel, LoadedModel]) -> None:
    target, draft = pair
    tokenizer: Any = target.tokenizer
    eos = set(tokenizer.eos_token_ids)
    edit = Request("edit", prompt_ids(tokenizer, EDIT), SamplingParams(), TOKENS)
    want = reference(target.model, edit.prompt_tokens, TOKENS, eos)

    got, seen = run_batch(target.model, tokenizer, [edit], Speculation("draft", 3, draft.model, gated=False),
                          arrivals=(0,))  # fmt: skip

    assert got == {"edit": want} and "average" in tokenizer.decode(want)
    drafted, accepted = sum(d for d, _ in seen.values()), sum(a for _, a in seen.values())
    print(f"draft model acceptance: {accepted}/{drafted} = {accepted / drafted:.2f}")
    assert accepted > drafted / 3  # a real draft: most steps take more than one token
