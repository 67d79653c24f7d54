from __future__ import annotations

from bench.make_model import SHAPES, tensor_shapes
from bench.prompts import PromptBook, build_prompt


class WordTokenizer:
    """One token per whitespace-separated word, plus 3 for the template."""

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: object) -> list[int]:
        return [0] * (3 + sum(len(m["content"].split()) for m in messages))


def test_build_prompt_pads_to_target() -> None:
    prompt = build_prompt(4, 200, WordTokenizer())
    assert prompt.num_tokens == 200 and "#4" in prompt.messages[0]["content"]


def test_prompt_book_variants_differ_unless_same_prompt() -> None:
    book = PromptBook(None, WordTokenizer(), same_prompt=False)
    assert book.get(1).messages != book.get(2).messages
    same = PromptBook(None, WordTokenizer(), same_prompt=True)
    assert same.get(1).messages == same.get(2).messages


def test_tensor_shapes_of_1b_match_llama_3_2_1b() -> None:
    shape = SHAPES["1b"]
    names = tensor_shapes(shape)
    params = sum(a * (b[0] if b else 1) for a, *b in (dims for dims in names.values()))
    assert abs(params - 1.236e9) / 1.236e9 < 0.01
    assert "lm_head.weight" not in names and names["model.layers.0.self_attn.k_proj.weight"] == (512, 2048)
