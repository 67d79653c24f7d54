"""BERT's WordPiece tokenizer from a GGUF vocabulary (`tokenizer.ggml.model = bert`).

llama.cpp stores a word-initial piece as `▁piece` and a continuation without BERT's `##`;
special and unused tokens keep their brackets. Undoing that gives back bert-base-uncased's own
vocabulary, which `tokenizers` runs with BERT's normaliser (lowercase, accents stripped, CJK
split), pre-tokenizer and `[CLS] … [SEP]` template.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

WORD_START = "\u2581"
MAX_WORD_CHARS = 100  # BERT's: a longer word is one [UNK]


def bert_piece(token: str) -> str:
    """A GGUF token spelled as BERT's vocabulary spells it."""
    if token.startswith("[") and token.endswith("]"):
        return token
    if token.startswith(WORD_START):
        return token[len(WORD_START) :]
    return "##" + token


def wordpiece_tokenizer(
    tokens: Sequence[str], cls_id: int, sep_id: int, unk_id: int, control: Sequence[int] = ()
) -> Tokenizer:
    """An uncased BERT tokenizer over the GGUF's tokens; encoding adds [CLS] and [SEP], and the
    `control` tokens ([PAD], [MASK], ...) written in a text are those tokens, as in BERT's own."""
    vocab = {bert_piece(t): i for i, t in enumerate(tokens)}
    tokenizer = Tokenizer(
        models.WordPiece(vocab, unk_token=bert_piece(tokens[unk_id]), max_input_chars_per_word=MAX_WORD_CHARS)
    )
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    cls, sep = bert_piece(tokens[cls_id]), bert_piece(tokens[sep_id])
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)],
    )
    tokenizer.decoder = decoders.WordPiece()
    tokenizer.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in control])
    return tokenizer
