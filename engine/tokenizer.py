"""The tokenizer as the protocols see it: text and chat messages in, token ids out."""

from __future__ import annotations

from typing import Any

from engine import templating


class ChatTokenizer:
    """Wraps mlx-lm's TokenizerWrapper. Pure CPU work, bounded (engine.templating): call it off
    the event loop. A prompt past `max_prompt_tokens` is refused with ContextTooLong."""

    def __init__(self, wrapper: Any, max_prompt_tokens: int | None = None) -> None:
        self._wrapper = wrapper
        self.max_prompt_tokens = max_prompt_tokens

    @property
    def wrapper(self) -> Any:
        return self._wrapper

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset(self._wrapper.eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return len(self._wrapper)

    @property
    def has_chat_template(self) -> bool:
        return bool(self._wrapper.has_chat_template)

    def encode(self, text: str) -> list[int]:
        """Raw text prompt: BOS added when the tokenizer's config says so."""
        return templating.encode_within(self._wrapper, text, self.max_prompt_tokens)

    def encode_continuation(self, text: str) -> list[int]:
        """Text that continues a sequence (a predicted output): no BOS or other special tokens."""
        return list(self._wrapper.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self._wrapper.decode(ids))

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        """Apply the chat template (with a generation prompt) and tokenize.

        Raises ValueError with the template's own message when it rejects the conversation
        (or runs past its bounds); only template variables of `template_kwargs` reach it.
        """
        kwargs = dict(template_kwargs or {})  # the protocols merge the server's defaults in
        if not self.has_chat_template:
            return self.encode(_plain_transcript(messages))
        text = templating.render(self._wrapper, messages, tools, kwargs)
        return templating.encode_within(self._wrapper, text, self.max_prompt_tokens, add_special_tokens=False)

    def detokenizer(self) -> Any:
        """A fresh streaming detokenizer (UTF-8 safe: holds back partial characters)."""
        return self._wrapper.detokenizer


def _plain_transcript(messages: list[dict[str, Any]]) -> str:
    # A model without a chat template still gets every turn, in order.
    lines = [f"{m.get('role', 'user')}: {m.get('content') or ''}" for m in messages]
    return "\n".join(lines) + "\nassistant:"
