"""Constrained decoding: one llguidance matcher per row, applied as an mlx-lm logits processor.

A request's grammar arrives as llguidance grammar text (the protocols compile and check it).
The engine builds one GrammarTokenizer from the model's tokenizer, lazily on first use, and
one Constraint per constrained row. The mask is applied with plain MLX ops (no Metal kernel),
so it runs wherever MLX does. When the grammar is complete the mask allows only EOS, so the
row ends with `stop`.
"""

from __future__ import annotations

import json
from copy import copy
from typing import TYPE_CHECKING, Any, cast

import llguidance
import mlx.core as mx
import numpy as np

from mlx_serve.engine.errors import EngineFailed, InvalidRequest, grammar_message
from mlx_serve.engine.model.mlx_boundary import Tokenizer, async_eval

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

DRY_RUN_STEPS = 3  # tokens a grammar is walked before a row follows it


class GrammarTokenizer:
    """llguidance's view of the model's vocabulary; built once per engine (about a second)."""

    def __init__(self, wrapper: Tokenizer) -> None:
        # mlx-lm's wrapper holds the HF tokenizer
        hf = cast("PreTrainedTokenizerFast", getattr(wrapper, "_tokenizer", wrapper))
        # Every id the scheduler ends a row on: a complete grammar allows exactly those.
        self.ll = llguidance.LLTokenizer(grammar_view(hf), eos_token=sorted(wrapper.eos_token_ids))

    def constraint(self, grammar: str) -> Constraint:
        """A fresh matcher for one row; a grammar llguidance refuses is an InvalidRequest."""
        matcher = llguidance.LLMatcher(self.ll, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequest(f"invalid grammar: {grammar_message(matcher.get_error())}", param="grammar")
        return Constraint(matcher, self.ll.vocab_size)

    def dry_run(self, grammar: str, steps: int = DRY_RUN_STEPS) -> str | None:
        """Why `grammar` cannot be followed with this vocabulary, or None: it is walked for a few
        tokens (the first one allowed at each step) as a row would be. A grammar that matches
        nothing (`start: start`, a `$ref` cycle), one past llguidance's lexer limits or one
        whose alternation is wider than a parser row can hold fails here, not mid-answer."""
        matcher = llguidance.LLMatcher(self.ll, grammar, log_level=0)
        constraint = Constraint(matcher, self.ll.vocab_size)
        for _ in range(steps):
            if matcher.is_error() or matcher.is_stopped():
                break
            allowed = constraint.allowed()
            if matcher.is_error():
                break
            ids = np.flatnonzero(allowed)
            if ids.size == 0:
                return "no text can follow it"
            if not matcher.consume_token(int(ids[0])):
                break
        return grammar_message(matcher.get_error()) if matcher.is_error() else None


class GrammarFailed(EngineFailed):
    """A row's grammar failed while it was decoding: the answer cannot honour it."""


class Constraint:
    """One row's grammar state.

    As a logits processor `(tokens, logits) -> logits` it follows mlx-lm's GenerationBatch:
    the first call is for the row's first generated token (nothing to consume yet); every
    later call first consumes the last token of the context, the one sampled a step earlier.
    `consume`, `rollback`, `allowed`, `apply` and `is_done` are the matcher underneath, for
    callers that drive it themselves (speculative verification of draft tokens).
    """

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self._started = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        # int() waits for the previous step's sampling only. A refused token (it cannot come
        # from the masked logits) or a parser past its limits fails the row (GrammarFailed, an
        # error to the client), never a normal stop with text the grammar did not finish.
        if self._started and not self.consume(int(tokens[-1])):
            raise GrammarFailed(f"the grammar failed during decoding: {grammar_message(self.error)}")
        self._started = True
        async_eval(logits)  # this step's forward runs while the CPU computes the mask
        masked = self.apply(logits)
        if self.matcher.is_error():
            raise GrammarFailed(f"the grammar failed during decoding: {grammar_message(self.error)}")
        return masked

    def consume(self, token: int) -> bool:
        """Advance past a sampled token; False if the grammar does not allow it."""
        return bool(self.matcher.consume_token(token))

    def validate(self, tokens: list[int]) -> int:
        """How many of `tokens` (a draft) the grammar accepts in a row, without consuming."""
        return int(self.matcher.validate_tokens(tokens))

    def rollback(self, num_tokens: int) -> None:
        """Forget the last `num_tokens` consumed tokens (rejected draft tokens)."""
        if num_tokens > 0 and not self.matcher.rollback(num_tokens):
            raise RuntimeError(f"grammar rollback of {num_tokens} tokens failed: {self.matcher.get_error()}")

    def is_done(self) -> bool:
        """The grammar is complete: only EOS may follow."""
        return bool(self.matcher.is_stopped())

    @property
    def error(self) -> str | None:
        """llguidance's message once the matcher has failed (a token it did not allow)."""
        return str(self.matcher.get_error()) if self.matcher.is_error() else None

    def allowed(self) -> np.ndarray:
        """The tokens the grammar allows next, as a bool per tokenizer id."""
        words = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(words, bitorder="little")[: self.vocab_size].astype(np.bool_)

    def apply(self, logits: mx.array) -> mx.array:
        """The row's `logits` with every token the grammar does not allow next at -inf."""
        allowed = self.allowed()
        width = logits.shape[-1]
        if width != allowed.size:  # the model's vocabulary may be padded past the tokenizer's
            allowed = np.pad(allowed[:width], (0, max(0, width - allowed.size)))
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))


def grammar_view(hf: Any) -> str:
    """The tokenizer's JSON as llguidance should read it.

    llguidance takes every added token for a special one, whose bytes grammar text never
    matches, yet tokenizes forced grammar text with added tokens matched: Qwen's non-special
    `<tool_call>` was forced by a tool-call grammar and then refused when sampled, ending the
    row. A non-special added token spelled in plain ASCII is moved into the vocabulary, where it
    is the text it decodes to.
    """
    backend = copy(hf.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    data = json.loads(backend.to_str())
    vocab = data.get("model", {}).get("vocab")
    if isinstance(vocab, dict):
        plain = [t for t in data["added_tokens"] if not t["special"] and _plain_ascii(t["content"])]
        vocab.update({t["content"]: t["id"] for t in plain})
        data["added_tokens"] = [t for t in data["added_tokens"] if t not in plain]
    return json.dumps(data)


def _plain_ascii(text: str) -> bool:
    # spelled the same in a byte-level and a SentencePiece vocabulary
    return text.isascii() and text.isprintable() and " " not in text
