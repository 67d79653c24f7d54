"""engine.host.encoder: the encoder engine's batching by arrival and its refusals, on a
random-weight BERT of a few thousand parameters with a WordPiece tokenizer (no model files)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import mlx.core as mx
import numpy as np
import pytest

from mlx_serve.engine.encoder.bert import Bert, BertConfig
from mlx_serve.engine.encoder.model import EncoderModel
from mlx_serve.engine.errors import EngineFailed, InvalidRequest, QueueFull
from mlx_serve.engine.gguf.wordpiece import wordpiece_tokenizer
from mlx_serve.engine.host.client import EngineState
from mlx_serve.engine.host.encoder import EncoderEngine
from mlx_serve.engine.types import EmbedInput, Request, SamplingParams

WORDS = ["apple", "banana", "cherry", "date", "elder", "fig", "grape", "poison"]
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *(f"\u2581{w}" for w in WORDS)]
POISON = TOKENS.index("\u2581poison")


def tiny_bert() -> Bert:
    c = BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=4)
    mx.random.seed(0)
    w = {
        "embeddings.word_embeddings.weight": mx.random.normal((len(TOKENS), 16)),
        "embeddings.position_embeddings.weight": mx.random.normal((64, 16)),
        "embeddings.token_type_embeddings.weight": mx.random.normal((2, 16)),
        "embeddings.LayerNorm.weight": mx.ones(16),
        "embeddings.LayerNorm.bias": mx.zeros(16),
    }
    for i in range(2):
        p = f"encoder.layer.{i}"
        shapes = {
            "attention.self.query": (16, 16), "attention.self.key": (16, 16), "attention.self.value": (16, 16),
            "attention.output.dense": (16, 16), "intermediate.dense": (32, 16), "output.dense": (16, 32),
        }  # fmt: skip
        for name, shape in shapes.items():
            w[f"{p}.{name}.weight"] = mx.random.normal(shape) * 0.3
            w[f"{p}.{name}.bias"] = mx.zeros(shape[0])
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[f"{p}.{norm}.weight"], w[f"{p}.{norm}.bias"] = mx.ones(16), mx.zeros(16)
    return Bert(c, w)


def tiny_model(gate: threading.Event | None = None, dimensions_trained: bool = False) -> EncoderModel:
    bert = tiny_bert()

    def network(ids: mx.array, mask: mx.array) -> mx.array:
        if gate is not None:
            gate.wait(10)
        if bool((ids == POISON).any()):
            raise RuntimeError("a token this network cannot take")
        return bert(ids, mask)

    tokenizer = wordpiece_tokenizer(TOKENS, cls_id=2, sep_id=3, unk_id=1, control=[0, 1, 2, 3])
    return EncoderModel(
        "tiny", network, tokenizer, dimensions=16, context_length=12, matryoshka=dimensions_trained
    )


def started(model: Callable[[], EncoderModel], **kw: int) -> EncoderEngine:
    engine = EncoderEngine(model, **kw)
    engine.start()
    return engine


async def ready(engine: EncoderEngine) -> EncoderEngine:
    await engine.wait_ready()
    return engine


def test_encoder_engine_batches_calls_that_arrive_together() -> None:
    gate = threading.Event()
    engine = started(lambda: tiny_model(gate))

    async def go() -> tuple[list[np.ndarray], list[np.ndarray]]:
        await ready(engine)
        first = asyncio.create_task(engine.embed(["apple"]))  # the thread takes it, then waits at the gate
        await asyncio.sleep(0.2)
        rest = [asyncio.create_task(engine.embed([w, "fig grape"])) for w in WORDS[1:7]]
        await asyncio.sleep(0.2)
        gate.set()
        together = [r.vectors for r in await asyncio.gather(first, *rest)]
        alone = [(await engine.embed([w, "fig grape"])).vectors for w in WORDS[1:7]]
        return together, alone

    together, alone = asyncio.run(go())
    assert engine.counters.embed_groups == 2 + 6  # the first call, then six arrivals in one group
    for a, b in zip(together[1:], alone):
        assert np.allclose(a, b, atol=1e-5) and a.shape == (2, 16)
    assert np.allclose(np.linalg.norm(together[0], axis=1), 1, atol=1e-5)
    engine.stop()


def test_encoder_engine_fails_only_the_call_with_the_bad_input() -> None:
    gate = threading.Event()
    engine = started(lambda: tiny_model(gate))

    async def go() -> list[object]:
        await ready(engine)
        first = asyncio.create_task(engine.embed(["apple"]))
        await asyncio.sleep(0.2)
        calls = [engine.embed(["banana"]), engine.embed(["cherry poison"]), engine.embed(["date"])]
        tasks = [asyncio.create_task(c) for c in calls]
        await asyncio.sleep(0.2)
        gate.set()
        return list(await asyncio.gather(first, *tasks, return_exceptions=True))

    outcomes = asyncio.run(go())
    assert isinstance(outcomes[2], EngineFailed)
    assert all(not isinstance(o, BaseException) for i, o in enumerate(outcomes) if i != 2)
    assert engine.state is EngineState.READY
    engine.stop()


def test_encoder_engine_refusals() -> None:
    engine = started(tiny_model, max_waiting_inputs=3)

    async def go() -> None:
        await ready(engine)
        inputs: list[EmbedInput] = ["apple", "fig", "grape", "date"]
        with pytest.raises(QueueFull):
            await engine.embed(inputs)
        with pytest.raises(
            InvalidRequest, match=r"`input\[1\]` is 13 tokens, over this model's context of 12"
        ):
            await engine.embed(["apple", " ".join(["fig"] * 11)])
        with pytest.raises(InvalidRequest, match="16-dimensional vectors only") as err:
            await engine.embed(["apple"], dimensions=8)
        assert err.value.param == "dimensions"
        assert (await engine.embed([[2, 4, 3]])).prompt_tokens == 3

    asyncio.run(go())
    assert engine.model is not None and engine.model.dimensions == 16
    request = Request(id="r", prompt_tokens=(1, 2), sampling=SamplingParams(), max_tokens=4)
    with pytest.raises(InvalidRequest, match="is an embedding model") as err:
        engine.submit([request])
    assert err.value.param == "model"
    engine.stop()


def test_encoder_engine_shortens_vectors_of_a_matryoshka_model() -> None:
    engine = started(lambda: tiny_model(dimensions_trained=True))

    async def go() -> np.ndarray:
        await ready(engine)
        return (await engine.embed(["apple banana"], dimensions=4)).vectors

    short = asyncio.run(go())
    assert short.shape == (1, 4) and np.allclose(np.linalg.norm(short), 1, atol=1e-5)
    engine.stop()


def test_wordpiece_from_gguf_spelling_splits_words_into_pieces() -> None:
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "\u2581play", "ing", "\u2581the"]
    tok = wordpiece_tokenizer(tokens, cls_id=2, sep_id=3, unk_id=1, control=[0, 1, 2, 3])
    assert tok.encode("The PLAYING zzz").ids == [2, 6, 4, 5, 1, 3]
