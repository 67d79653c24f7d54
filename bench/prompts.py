"""Prompts that make a model write long answers, one distinct variant per request.

A variant's distinct part comes first in the user message so a prefix cache cannot reuse one
request's prompt for the next (beyond the chat template's shared preamble), unless the caller
asks for the same prompt every time. `prompt_tokens` pads the message with seeded filler words
until the chat-templated prompt reaches that many tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, cast

TOPICS = (
    "a lighthouse keeper who finds a map",
    "a city that forgets one word every night",
    "two rival bakers during a blizzard",
    "a robot learning to paint",
    "an expedition under the ice of Europa",
    "a librarian who can hear books",
    "a river that flows uphill",
    "the last clockmaker in a digital world",
)
FILLER_WORDS = (
    *("amber", "harbor", "lantern", "meadow", "quartz", "violet", "engine", "orchard"),
    *("thunder", "cobalt", "willow", "canyon", "signal", "marble", "ember", "falcon"),
    *("glacier", "saffron", "tunnel", "velvet", "prism", "summit", "compass", "orbit"),
)


class ChatTokenizer(Protocol):
    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: object) -> object: ...


@dataclass(frozen=True, slots=True)
class Prompt:
    """One chat request's messages and its templated token count (when a tokenizer was given)."""

    variant: int
    messages: list[dict[str, str]]
    num_tokens: int | None


def instruction(variant: int) -> str:
    topic = TOPICS[variant % len(TOPICS)]
    return (
        f"Story request #{variant}. Write a very long, detailed story about {topic}. "
        "Use many chapters, vivid descriptions and dialogue, and do not stop early."
    )


def filler(variant: int, num_words: int) -> str:
    rng = random.Random(variant)
    return " ".join(rng.choice(FILLER_WORDS) for _ in range(num_words))


def messages_for(variant: int, num_filler_words: int) -> list[dict[str, str]]:
    text = instruction(variant)
    if num_filler_words:
        text += "\nWeave in these words: " + filler(variant, num_filler_words)
    return [{"role": "user", "content": text}]


def count_tokens(tokenizer: ChatTokenizer, messages: list[dict[str, str]]) -> int:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]  # type: ignore[index]
    return len(ids)  # type: ignore[arg-type]


def build_prompt(variant: int, target_tokens: int | None, tokenizer: ChatTokenizer | None) -> Prompt:
    """The prompt for `variant`, padded (binary search on filler words) to about `target_tokens`."""
    if tokenizer is None:
        return Prompt(variant, messages_for(variant, 0), None)
    base = count_tokens(tokenizer, messages_for(variant, 0))
    if not target_tokens or target_tokens <= base:
        return Prompt(variant, messages_for(variant, 0), base)
    lo, hi = 0, target_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(tokenizer, messages_for(variant, mid)) <= target_tokens:
            lo = mid
        else:
            hi = mid - 1
    messages = messages_for(variant, lo)
    return Prompt(variant, messages, count_tokens(tokenizer, messages))


def load_tokenizer(model_dir: Path) -> ChatTokenizer | None:
    """The model's Hugging Face tokenizer, or None when transformers cannot load it."""
    try:
        from transformers import AutoTokenizer

        return cast(ChatTokenizer, AutoTokenizer.from_pretrained(str(model_dir)))
    except Exception as exc:  # noqa: BLE001 - sizing prompts is optional
        print(f"note: cannot load tokenizer from {model_dir} ({exc}); prompts are not sized")
        return None


class PromptBook:
    """Hands out prompts by request index; `same_prompt` gives variant 0 every time."""

    def __init__(self, target_tokens: int | None, tokenizer: ChatTokenizer | None, same_prompt: bool) -> None:
        self._target = target_tokens
        self._tokenizer = tokenizer
        self._same = same_prompt
        self._cache: dict[int, Prompt] = {}

    def get(self, index: int) -> Prompt:
        variant = 0 if self._same else index
        if variant not in self._cache:
            self._cache[variant] = build_prompt(variant, self._target, self._tokenizer)
        return self._cache[variant]
