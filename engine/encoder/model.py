"""A loaded encoder: its network, tokenizer and facts, and how its inputs become token rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
from tokenizers import Tokenizer

from mlx_serve.engine.encoder.batcher import DEFAULT_FORWARD_TOKENS
from mlx_serve.engine.errors import ContextTooLong, InvalidRequest
from mlx_serve.engine.types import EmbedInput

Network = Callable[[mx.array, mx.array], mx.array]  # (ids, mask) → hidden states


@dataclass(frozen=True, slots=True)
class EncoderModel:
    """An embedding model ready to run: `network(ids, mask)` gives hidden states to pool."""

    model_id: str
    network: Network
    tokenizer: Tokenizer  # adds the model's special tokens; no truncation, no padding
    dimensions: int
    context_length: int  # the longest input, in tokens, special tokens included
    matryoshka: bool = False  # trained so that a prefix of the vector is a vector too
    forward_tokens: int = DEFAULT_FORWARD_TOKENS

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def rows(self, inputs: Sequence[EmbedInput], field: str = "input") -> list[list[int]]:
        """Each input's token ids; InvalidRequest naming the input that is empty, holds an id
        outside the vocabulary, or does not fit the context."""
        texts = [(i, t) for i, t in enumerate(inputs) if isinstance(t, str)]
        encoded = self.tokenizer.encode_batch([t for _, t in texts]) if texts else []
        by_index = {i: e.ids for (i, _), e in zip(texts, encoded)}
        out = []
        for i, item in enumerate(inputs):
            where = field if len(inputs) == 1 else f"{field}[{i}]"
            ids = by_index[i] if isinstance(item, str) else self._checked_ids(item, where)
            if not item:
                raise InvalidRequest(f"`{where}` is empty", param=field)
            if len(ids) > self.context_length:
                raise ContextTooLong(
                    f"`{where}` is {len(ids)} tokens, over this model's context of {self.context_length}",
                    param=field,
                )
            out.append(list(ids))
        return out

    def _checked_ids(self, ids: Sequence[int], where: str) -> list[int]:
        vocab = self.vocab_size
        for j, token in enumerate(ids):
            if not 0 <= token < vocab:
                raise InvalidRequest(
                    f"token id {token} at `{where}[{j}]` is not in this model's vocabulary (0..{vocab - 1})",
                    param="input",
                )
        return list(ids)

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is None or dimensions == self.dimensions:
            return
        if not self.matryoshka:
            raise InvalidRequest(
                f"`dimensions`: {self.model_id} gives {self.dimensions}-dimensional vectors only "
                "(it was not trained for shortened ones)",
                param="dimensions",
            )
        if not 1 <= dimensions <= self.dimensions:
            raise InvalidRequest(f"`dimensions` must be between 1 and {self.dimensions}", param="dimensions")
