"""Tier 3: the encoder in a child process (engine.host.encoder_process) with the real
all-MiniLM-L6-v2: the same vectors as in-process, and a killed child fails only the calls it
held, then serves again."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from mlx_serve.engine.encoder.loader import load_encoder
from mlx_serve.engine.encoder.pooling import finish
from mlx_serve.engine.encoder.runner import pooled
from mlx_serve.engine.errors import EngineFailed, EngineUnavailable
from mlx_serve.engine.host.client import EngineState
from mlx_serve.engine.host.encoder_process import EncoderProcessEngine

pytestmark = pytest.mark.real

TEXTS = ["A man is eating food.", "A man is eating a piece of bread."]


def test_encoder_child_gives_in_process_vectors_and_survives_its_death() -> None:
    model = load_encoder("all-minilm-l6-v2")
    want = finish(pooled(model, model.rows(TEXTS)), model.dimensions, None)
    engine = EncoderProcessEngine("all-minilm-l6-v2")
    engine.start()

    async def go() -> None:
        await engine.wait_ready()
        assert engine.pid is not None and engine.pid != os.getpid()
        got = await engine.embed(TEXTS)
        assert np.allclose(got.vectors, want, atol=1e-5) and got.prompt_tokens == 19
        held = asyncio.create_task(engine.embed([" ".join(["word"] * 200)] * 256))
        await asyncio.sleep(1.0)  # tokenized and sent: the child is running it
        os.kill(engine.pid, signal.SIGKILL)
        with pytest.raises(EngineFailed, match="exited|restarting"):
            await held
        for _ in range(600):
            if engine.state is EngineState.READY:
                break
            with pytest.raises(EngineUnavailable):
                await engine.embed(TEXTS)
            await asyncio.sleep(0.1)
        again = await engine.embed(TEXTS)
        assert np.allclose(again.vectors, want, atol=1e-5)
        assert (await engine.stats())["restarts"] == 1

    try:
        asyncio.run(go())
    finally:
        engine.stop()
