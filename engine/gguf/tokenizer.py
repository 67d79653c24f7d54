"""A Hugging Face `tokenizers` tokenizer rebuilt from a GGUF file's `tokenizer.*` metadata.

Two families: byte-level BPE (`tokenizer.ggml.model == "gpt2"`: SmolLM2, Llama 3, …) with its
pre-tokenizer picked by `tokenizer.ggml.pre`, and SentencePiece-style BPE with byte fallback
(`"llama"`: Gemma, Llama 2, …) whose merges are rebuilt from the vocabulary. The result is
written as tokenizer.json + tokenizer_config.json, shaped so that mlx-lm picks its fast
streaming detokenizer (BPE for byte-level, SPM for SentencePiece).
"""

from __future__ import annotations

import json
import logging
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE
from tokenizers.processors import ByteLevel as ByteLevelProcessor
from tokenizers.processors import TemplateProcessing

from mlx_serve.engine.gguf.reader import GGUFFile
from mlx_serve.engine.gguf.vocab import GGUFVocab, read_vocab

logger = logging.getLogger(__name__)

SPIECE_SPACE = "\u2581"

# llama.cpp token types (gguf.TokenType)
_CONTROL = 3
_USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2's: Llama 3's with every digit on its own
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_PRE = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"})
_QWEN2_PRE = frozenset({"qwen2", "deepseek-r1-qwen", "megrez"})
# tokenizer.ggml.pre -> the split regex its merges were learned on (ByteLevel runs after it)
_SPLITS = MappingProxyType(
    {**dict.fromkeys(_LLAMA3_PRE, _LLAMA3_SPLIT), **dict.fromkeys(_QWEN2_PRE, _QWEN2_SPLIT)}
)
_GPT2_PRE = frozenset({"default", "gpt2", "gpt-2"})
# Gemma's scores do not follow its merge order; its token order does (as transformers does)
_ORDER_RANKED_ARCHS = frozenset({"gemma", "gemma2", "gemma3"})


def build_tokenizer(vocab: GGUFVocab, architecture: str) -> Tokenizer:
    """The `tokenizers` pipeline the file describes; ValueError for an unknown family."""
    match vocab.model:
        case "gpt2":
            tokenizer = _byte_level_tokenizer(vocab)
        case "llama":
            tokenizer = _sentencepiece_tokenizer(vocab, order_ranked=architecture in _ORDER_RANKED_ARCHS)
        case other:
            raise ValueError(f"GGUF tokenizer model {other!r} is not supported (gpt2, llama)")
    _add_special_tokens(tokenizer, vocab)
    tokenizer.post_processor = _post_processor(vocab)
    return tokenizer


def tokenizer_config(vocab: GGUFVocab, max_length: int) -> dict[str, Any]:
    """tokenizer_config.json: special tokens, BOS/EOS policy and the chat template."""
    config: dict[str, Any] = {
        # the generic class loads tokenizer.json as written; model-specific classes may rebuild it
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": vocab.token(vocab.bos_id),
        "eos_token": vocab.token(vocab.eos_id),
        "unk_token": vocab.token(vocab.unk_id),
        "pad_token": vocab.token(vocab.pad_id),
        "add_bos_token": vocab.add_bos,
        "add_eos_token": vocab.add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    if vocab.chat_template:
        config["chat_template"] = vocab.chat_template
    return config


def write_tokenizer(gguf: GGUFFile, folder: Path, max_length: int) -> GGUFVocab:
    """Write tokenizer.json and tokenizer_config.json for `gguf` into `folder`."""
    vocab = read_vocab(gguf)
    build_tokenizer(vocab, gguf.architecture).save(str(folder / "tokenizer.json"))
    config = tokenizer_config(vocab, max_length)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    return vocab


# --- byte-level BPE -------------------------------------------------------------------------


@cache
def _byte_alphabet() -> dict[int, str]:  # computed once, never mutated
    """GPT-2's byte -> printable character table."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return table


def _byte_level_spelling(token: str) -> str:
    """Tokens are stored byte-level spelled; one that is not (a mislabelled raw token) gets spelled."""
    if set(token) <= _byte_charset():
        return token
    alphabet = _byte_alphabet()
    return "".join(alphabet[b] for b in token.encode("utf-8"))


@cache
def _byte_charset() -> frozenset[str]:
    return frozenset(_byte_alphabet().values())


def _byte_level_tokenizer(vocab: GGUFVocab) -> Tokenizer:
    if vocab.merges is None:
        raise ValueError("GGUF byte-level BPE tokenizer has no tokenizer.ggml.merges")
    # Control and user-defined tokens are matched whole as added tokens, by their own text:
    # spelled byte-level, a non-ASCII one (DeepSeek-R1's `<｜User｜>`) would get a new id.
    types = vocab.token_types.tolist()
    whole = {i for i, k in enumerate(types) if k in (_CONTROL, _USER_DEFINED)}
    ids = {(t if i in whole else _byte_level_spelling(t)): i for i, t in enumerate(vocab.tokens)}
    merges = [_merge_pair(m) for m in vocab.merges]
    # llama.cpp takes a whole pre-token found in a Llama 3 vocabulary without merging
    model = BPE(ids, merges, fuse_unk=False, byte_fallback=False, ignore_merges=vocab.pre in _LLAMA3_PRE)
    tokenizer = Tokenizer(model)
    if vocab.pre in _QWEN2_PRE:
        # Qwen2's own tokenizer.json normalizes to NFC first (a GGUF cannot say so), and
        # transformers rebuilds a qwen2 folder's tokenizer that way whatever is written here
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = _byte_level_pre_tokenizer(vocab.pre)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _merge_pair(merge: str) -> tuple[str, str]:
    left, _, right = merge.partition(" ")
    return left, right


def _byte_level_pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        # SmolLM splits every digit on its own before the GPT-2 regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _SPLITS:
        split = pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated")
        return pre_tokenizers.Sequence(
            [split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
    if pre not in _GPT2_PRE:
        logger.warning("GGUF pre-tokenizer %r is not known; using GPT-2's split", pre)
    return byte_level


# --- SentencePiece-style BPE ---------------------------------------------------------------


def _sentencepiece_tokenizer(vocab: GGUFVocab, *, order_ranked: bool) -> Tokenizer:
    tokens = [_spm_spelling(t) for t in vocab.tokens]
    ids = {t: i for i, t in enumerate(tokens)}
    if order_ranked or vocab.scores is None:
        ranks = {t: -float(i) for i, t in enumerate(tokens)}
    else:
        ranks = {t: float(s) for t, s in zip(tokens, vocab.scores)}
    unk = vocab.token(vocab.unk_id)
    model = BPE(ids, _rebuild_merges(ids, ranks), unk_token=unk, fuse_unk=True, byte_fallback=True)
    tokenizer = Tokenizer(model)
    if vocab.add_space_prefix:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPIECE_SPACE, prepend_scheme="first", split=False
        )
    else:
        tokenizer.normalizer = normalizers.Replace(" ", SPIECE_SPACE)
        # a no-op after the normalizer; kept to match transformers' GemmaTokenizer
        tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tokenizer.decoder = _spm_decoder(strip_prefix=vocab.add_space_prefix)
    return tokenizer


def _spm_spelling(token: str) -> str:
    """The normalizer turns every space into ▁ before the model sees text, but llama.cpp's Gemma
    files keep whitespace tokens with real spaces: spell them the way they will be looked up."""
    return token.replace(" ", SPIECE_SPACE)


def _rebuild_merges(ids: dict[str, int], ranks: dict[str, float]) -> list[tuple[str, str]]:
    """Every split of a token into two vocabulary tokens, best-ranked token first.

    The same order transformers' `generate_merges` yields: by rank, then longer left piece,
    then longer right piece, ties kept in vocabulary order.
    """
    merges: list[tuple[str, str, float]] = []
    for token, rank in ranks.items():
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                merges.append((left, right, rank))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _spm_decoder(*, strip_prefix: bool) -> decoders.Decoder:
    steps = [decoders.Replace(SPIECE_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if strip_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    return decoders.Sequence(steps)


# --- shared ----------------------------------------------------------------------------------


def _add_special_tokens(tokenizer: Tokenizer, vocab: GGUFVocab) -> None:
    """Control tokens become special added tokens and user-defined ones plain added tokens,
    so both are matched whole in the text instead of being cut into pieces."""
    known = tokenizer.get_vocab()
    types = vocab.token_types.tolist()
    control = [t for t, k in zip(vocab.tokens, types) if k == _CONTROL and t in known]
    user = [t for t, k in zip(vocab.tokens, types) if k == _USER_DEFINED and t in known]
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _post_processor(vocab: GGUFVocab) -> Any:
    bos, eos = vocab.token(vocab.bos_id), vocab.token(vocab.eos_id)
    bos = bos if vocab.add_bos else None
    eos = eos if vocab.add_eos else None
    if bos is None and eos is None:
        return ByteLevelProcessor(trim_offsets=False) if vocab.model == "gpt2" else None
    single = _template("$A", 0, bos, eos)
    pair = single + _template("$B", 1, bos, eos)
    specials = [
        (t, i) for t, i in ((bos, vocab.bos_id), (eos, vocab.eos_id)) if t is not None and i is not None
    ]
    return TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def _template(sequence: str, type_id: int, bos: str | None, eos: str | None) -> list[str]:
    pieces = [p for p in (bos, sequence, eos) if p is not None]
    return [f"{p}:{type_id}" for p in pieces]
