"""Tier 3: `--model nomic-embed-text-v1.5` (a nomic-bert GGUF of our own MLX model) behind a real
Hypercorn, through the official openai SDK: Matryoshka `dimensions`, its 2048-token context."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import openai
import pytest

from mlx_serve.engine.encoder.loader import load_encoder
from mlx_serve.engine.encoder.pooling import finish
from mlx_serve.engine.encoder.runner import pooled
from tests.support.server_proc import ServerProcess

pytestmark = pytest.mark.real

MODEL = "nomic-embed-text-v1.5"
TEXTS = [
    "search_query: What is the capital of France?",
    "search_document: Paris is the capital and largest city of France.",
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    server = ServerProcess(["--model", MODEL], tmp_path_factory.mktemp("logs") / "nomic.log", bare=True)
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    server.close()


@pytest.fixture(scope="module")
def direct_pooled() -> np.ndarray:
    model = load_encoder(MODEL)
    return pooled(model, model.rows(TEXTS))


def test_nomic_served_vectors_at_each_size(client: openai.OpenAI, direct_pooled: np.ndarray) -> None:
    for dims in (None, 512, 256, 64):
        extra = {} if dims is None else {"dimensions": dims}
        r = client.embeddings.create(model=MODEL, input=TEXTS, **extra)  # type: ignore[arg-type]
        got = np.array([d.embedding for d in r.data])
        assert got.shape == (2, dims or 768)
        assert np.allclose(got, finish(direct_pooled, 768, dims), atol=1e-5)
        assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_nomic_refuses_sizes_and_lengths_it_cannot_give(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="between 1 and 768") as err:
        client.embeddings.create(model=MODEL, input="hi", dimensions=1024)
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "dimensions"
    with pytest.raises(openai.BadRequestError, match="over this model's context of 2048") as err:
        client.embeddings.create(model=MODEL, input=["search_document: " + "word " * 2100])
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "input"
