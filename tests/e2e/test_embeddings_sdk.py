"""Tier 3: the official openai SDK's `client.embeddings.create` against a real Hypercorn serving
the real all-MiniLM-L6-v2 (`--model all-minilm-l6-v2`)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from mlx_serve.engine.encoder.loader import load_encoder
from mlx_serve.engine.encoder.pooling import finish
from mlx_serve.engine.encoder.runner import pooled
from tests.support.server_proc import ServerProcess

pytestmark = pytest.mark.real

MODEL = "all-minilm-l6-v2"  # the --model argument: a name requests may use
TEXTS = ["A man is eating food.", "A man is eating a piece of bread.", "The new movie is awesome"]


@pytest.fixture(scope="module")
def minilm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "minilm-server.log"
    server = ServerProcess(["--model", "all-minilm-l6-v2"], log, bare=True)
    yield server
    server.close()


@pytest.fixture(scope="module")
def client(minilm_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=minilm_server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def direct() -> np.ndarray:
    """The same texts through engine.encoder in this process (held to numpy BERT elsewhere)."""
    model = load_encoder("all-minilm-l6-v2")
    return finish(pooled(model, model.rows(list(TEXTS))), model.dimensions, None)


def test_embeddings_default_call_gives_the_models_vectors(client: openai.OpenAI, direct: np.ndarray) -> None:
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)  # the SDK asks for base64
    got = np.array([d.embedding for d in r.data])
    assert got.shape == (3, 384) and [d.index for d in r.data] == [0, 1, 2]
    assert np.allclose(got, direct, atol=1e-5)
    assert float(got[0] @ got[1]) == pytest.approx(0.7553, abs=5e-4)
    assert r.model == "all-MiniLM-L6-v2" and r.object == "list"
    assert r.usage.prompt_tokens == r.usage.total_tokens == 8 + 11 + 7


def test_embeddings_float_and_base64_carry_the_same_vector(minilm_server: ServerProcess) -> None:
    body = {"model": "all-minilm-l6-v2", "input": TEXTS[0]}
    floats = httpx.post(minilm_server.url + "/v1/embeddings", json={**body, "encoding_format": "float"})
    packed = httpx.post(minilm_server.url + "/v1/embeddings", json={**body, "encoding_format": "base64"})
    as_list = floats.json()["data"][0]["embedding"]
    raw = base64.b64decode(packed.json()["data"][0]["embedding"])
    assert isinstance(as_list, list) and len(as_list) == 384
    assert np.array_equal(np.array(as_list, dtype=np.float32), np.frombuffer(raw, dtype="<f4"))


def test_embeddings_token_ids_in(client: openai.OpenAI, direct: np.ndarray) -> None:
    ids = [101, 1037, 2158, 2003, 5983, 2833, 1012, 102]  # "[CLS] a man is eating food. [SEP]"
    one = client.embeddings.create(model=MODEL, input=ids, encoding_format="float")
    many = client.embeddings.create(model=MODEL, input=[ids, ids[:4] + [102]], encoding_format="float")
    assert len(one.data) == 1 and len(many.data) == 2
    assert np.allclose(one.data[0].embedding, direct[0], atol=1e-5)
    assert one.usage.prompt_tokens == 8 and many.usage.prompt_tokens == 13


def test_embeddings_refusals_name_the_field(client: openai.OpenAI) -> None:
    cases = [
        ({"input": ""}, "input", "empty"),
        ({"input": []}, "input", "empty"),
        ({"input": ["ok", "word " * 300]}, "input", "over this model's context of 256"),
        ({"input": [[101, 99999, 102]]}, "input", "vocabulary"),
        ({"input": ["ok", 3]}, "input", "not a mix"),
        ({"input": "ok", "dimensions": 128}, "dimensions", "384-dimensional"),
    ]
    for fields, param, words in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.embeddings.create(model=MODEL, **fields)  # type: ignore[arg-type]
        assert err.value.status_code == 400 and words in err.value.message, fields
        assert isinstance(err.value.body, dict) and err.value.body.get("param") == param, fields


def test_embeddings_model_is_listed_and_other_names_refused(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == ["all-MiniLM-L6-v2"]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="hi")


def test_embeddings_server_refuses_chat_in_its_envelope(
    client: openai.OpenAI, minilm_server: ServerProcess
) -> None:
    with pytest.raises(openai.BadRequestError, match="is an embedding model"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    r = httpx.post(
        minilm_server.url + "/v1/messages",
        json={"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "embedding model" in r.json()["error"]["message"]


def test_embeddings_concurrent_calls_each_get_their_own_vectors(
    client: openai.OpenAI, direct: np.ndarray
) -> None:
    def call(i: int) -> list[float]:
        return client.embeddings.create(model=MODEL, input=TEXTS[i % 3]).data[0].embedding

    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(call, range(24)))
    for i, vector in enumerate(got):
        assert np.allclose(vector, direct[i % 3], atol=1e-5)


def test_embeddings_on_a_chat_model_is_a_400(smollm_server: ServerProcess) -> None:
    r = httpx.post(smollm_server.url + "/v1/embeddings", json={"model": "m", "input": "hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "has no embeddings" in r.json()["error"]["message"]


def test_embeddings_log_names_the_model(minilm_server: ServerProcess, tmp_path: Path) -> None:
    assert "embedding model all-MiniLM-L6-v2: 384 dimensions, context 256 tokens" in minilm_server.log()
