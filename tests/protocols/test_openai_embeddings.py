"""protocols.openai_embeddings: the request's input shapes, its refusals, and the answer."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.engine.host.client import Embeddings
from mlx_serve.protocols import openai_embeddings as oe


def parse(body: dict[str, object]) -> oe.EmbedJob:
    return oe.parse(orjson.dumps(body))


def test_parse_takes_each_input_shape() -> None:
    assert parse({"input": "hi"}).inputs == ["hi"]
    assert parse({"input": ["a", "b"]}).inputs == ["a", "b"]
    assert parse({"input": [1, 2, 3]}).inputs == [[1, 2, 3]]
    assert parse({"input": [[1, 2], [3]]}).inputs == [[1, 2], [3]]
    job = parse({"input": "x", "model": "m", "encoding_format": "base64", "dimensions": 64, "user": "u"})
    assert (job.model, job.base64, job.dimensions) == ("m", True, 64)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": ["a", 1]}, "input"),
        ({"input": [True, 1]}, "input"),
        ({"input": {"text": "a"}}, "input"),
        ({"input": ["a"] * 2049}, "input"),
        ({}, "input"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
    ],
)
def test_parse_refuses_naming_the_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        parse(body)
    assert err.value.param == param


def test_to_json_is_openais_shape_in_both_encodings() -> None:
    vectors = np.array([[0.6, 0.8], [1.0, 0.0]], dtype=np.float32)
    result = Embeddings(vectors, prompt_tokens=9)
    body = orjson.loads(oe.to_json(parse({"input": ["a", "b"]}), result, "mini"))
    assert body["object"] == "list" and body["model"] == "mini"
    assert body["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["object"] == "embedding"
    assert np.allclose(body["data"][0]["embedding"], [0.6, 0.8])
    packed = orjson.loads(
        oe.to_json(parse({"input": "a", "model": "x", "encoding_format": "base64"}), result, "mini")
    )
    assert packed["model"] == "x"
    assert np.array_equal(np.frombuffer(base64.b64decode(packed["data"][1]["embedding"]), "<f4"), vectors[1])
