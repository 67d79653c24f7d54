"""Tier 3: nomic-embed-text-v1.5 (its F16 GGUF, extracted from gpt4all's zip slices) through
engine.encoder, held to a plain numpy nomic-bert on the same weights (tests/support/embed_reference.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from mlx_serve.engine.encoder.loader import FOLDER_SHORTCUTS, GGUF_SHORTCUTS, is_encoder, load_encoder
from mlx_serve.engine.encoder.model import EncoderModel
from mlx_serve.engine.encoder.pooling import finish
from mlx_serve.engine.encoder.runner import pooled
from mlx_serve.engine.gguf.slices import SliceError
from mlx_serve.engine.gguf.zipped import extract
from mlx_serve.engine.model.loader import cache_root
from tests.support.embed_reference import matryoshka, nomic_pooled

pytestmark = pytest.mark.real

TEXTS = [
    "search_query: What is the capital of France?",
    "search_document: Paris is the capital and largest city of France.",
    "search_document: The mitochondria is the powerhouse of the cell.",
    "clustering: naïve café — déjà vu, 東京タワー 🗼",
    "classification: def add(a, b):\n    return a + b  # 42",
    "search_document: " + " ".join(["Sentence embeddings map text to vectors."] * 40),
]
TRICKY = [
    "[CLS] [MASK] tokens",
    "a[SEP]b [unused3]",
    "HELLO   World!!",
    "x" * 300,
    "\t\u00a0odd\u200bspaces 1234.5 $€",
]


@pytest.fixture(scope="module")
def nomic() -> EncoderModel:
    return load_encoder("nomic-embed-text-v1.5")


@pytest.fixture(scope="module")
def reference_weights() -> dict[str, np.ndarray]:
    raw = mx.load(str(cache_root() / "models" / GGUF_SHORTCUTS["nomic-embed-text-v1.5"].file_name))
    assert isinstance(raw, dict)
    return {k: np.array(v.astype(mx.float32), dtype=np.float64) for k, v in raw.items()}


def test_nomic_matches_the_numpy_reference(
    nomic: EncoderModel, reference_weights: dict[str, np.ndarray]
) -> None:
    ours = pooled(nomic, nomic.rows(TEXTS))  # one batch: padding must not leak into any row
    for text, got in zip(TEXTS, ours):
        want = nomic_pooled(reference_weights, nomic.rows([text])[0], n_heads=12)
        for dims in (None, 512, 256, 64):
            a = finish(got[None], 768, dims)[0]
            b = want / np.linalg.norm(want) if dims is None else matryoshka(want, dims)
            assert a.shape == (dims or 768,) and float(a @ b) >= 0.999, (text, dims)


def test_nomic_ranks_the_relevant_document_first(nomic: EncoderModel) -> None:
    q, paris, cell = finish(pooled(nomic, nomic.rows(TEXTS[:3])), 768, None)
    assert float(q @ paris) > float(q @ cell) + 0.2


def test_nomic_tokenizer_is_bert_base_uncased(nomic: EncoderModel) -> None:
    bert = load_encoder("all-minilm-l6-v2").tokenizer  # the same uncased BERT vocabulary, from tokenizer.json
    for text in TEXTS + TRICKY:
        assert nomic.tokenizer.encode(text).ids == bert.encode(text).ids, text


def test_nomic_facts(nomic: EncoderModel) -> None:
    assert (nomic.dimensions, nomic.context_length, nomic.matryoshka) == (768, 2048, True)
    nomic.check_dimensions(64)
    assert "all-minilm-l6-v2" in FOLDER_SHORTCUTS  # both shortcuts stay one word


def test_zipped_member_with_the_wrong_digest_is_never_kept(tmp_path: Path) -> None:
    wrong = dataclasses.replace(GGUF_SHORTCUTS["nomic-embed-text-v1.5"], sha256="0" * 64)
    target = tmp_path / "nomic.gguf"
    with pytest.raises(SliceError, match="expected 274290560 bytes with sha256 0000"):
        extract(wrong, target, lambda _: None)
    assert list(tmp_path.iterdir()) == []


def test_a_nomic_bert_gguf_path_is_an_embedding_model_and_a_chat_gguf_is_not(smollm_gguf: Path) -> None:
    path = cache_root() / "models" / GGUF_SHORTCUTS["nomic-embed-text-v1.5"].file_name
    assert is_encoder(str(path)) and is_encoder("nomic-embed-text-v1.5") and is_encoder("ALL-MiniLM-L6-v2")
    assert not is_encoder(str(smollm_gguf)) and not is_encoder(None) and not is_encoder("qwen2.5-coder-0.5b")
    assert load_encoder(str(path)).model_id == "nomic-embed-text-v1.5.f16"


@pytest.fixture(scope="module")
def smollm_gguf() -> Path:
    from mlx_serve.engine.model.loader import default_gguf

    return default_gguf()
