"""The tokenizer half of a GGUF file's metadata: its vocabulary, special ids and policies.

What llama.cpp's `tokenizer.*` keys say, read into one record; engine.gguf.tokenizer builds a
Hugging Face tokenizer from it, engine.gguf.convert takes the ids that end generation. Apart so
that reading the file's keys and rebuilding a tokenizer pipeline can each be read alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mlx_serve.engine.gguf.reader import GGUFFile


@dataclass(frozen=True, slots=True)
class GGUFVocab:
    """The tokenizer half of a GGUF file's metadata."""

    model: str
    pre: str
    tokens: list[str]
    token_types: np.ndarray
    scores: np.ndarray | None
    merges: list[str] | None
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    extra_eos_ids: tuple[int, ...]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.tokens[token_id]


def read_vocab(gguf: GGUFFile) -> GGUFVocab:
    """The tokenizer metadata of a parsed GGUF file."""
    md = gguf.metadata
    model = str(md.get("tokenizer.ggml.model", ""))
    return GGUFVocab(
        model=model,
        pre=str(md.get("tokenizer.ggml.pre", "default")),
        tokens=list(md["tokenizer.ggml.tokens"]),
        token_types=np.asarray(md.get("tokenizer.ggml.token_type", []), dtype=np.int32),
        scores=md.get("tokenizer.ggml.scores"),
        merges=md.get("tokenizer.ggml.merges"),
        bos_id=_int_key(md, "bos_token_id"),
        eos_id=_int_key(md, "eos_token_id"),
        unk_id=_int_key(md, "unknown_token_id"),
        pad_id=_int_key(md, "padding_token_id"),
        extra_eos_ids=tuple(
            i for k in ("eot_token_id", "eom_token_id") if (i := _int_key(md, k)) is not None
        ),
        # llama.cpp adds BOS to a SentencePiece vocabulary unless the file says otherwise
        add_bos=bool(md.get("tokenizer.ggml.add_bos_token", model == "llama")),
        add_eos=bool(md.get("tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=bool(md.get("tokenizer.ggml.add_space_prefix", model == "llama")),
        chat_template=md.get("tokenizer.chat_template"),
    )


def _int_key(md: dict[str, Any], key: str) -> int | None:
    value = md.get(f"tokenizer.ggml.{key}")
    return None if value is None else int(value)


def eos_token_ids(vocab: GGUFVocab) -> list[int]:
    """Every id that ends generation: EOS plus end-of-turn/message where the file names them."""
    ids = [vocab.eos_id] if vocab.eos_id is not None else []
    return ids + [i for i in vocab.extra_eos_ids if i not in ids]
