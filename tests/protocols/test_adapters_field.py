"""mlx_lm.server's `adapters` request field (an adapter folder) on both OpenAI formats: honoured
when it names the adapter the model is served with, else a 400 naming the field and saying how
to serve adapters."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.protocols import openai_chat, openai_completions
from mlx_serve.protocols.contract import Job, ProtocolContext, WireFormat

FORMATS = [
    (openai_chat.FORMAT, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    (openai_completions.FORMAT, {"model": "m", "prompt": "hi"}),
]


@pytest.fixture(params=FORMATS, ids=["chat", "completions"])
def parse(request: pytest.FixtureRequest) -> Callable[[ProtocolContext, str], Job]:
    wire: WireFormat = request.param[0]

    def run(ctx: ProtocolContext, adapters: str) -> Job:
        return wire.parse(orjson.dumps({**request.param[1], "adapters": adapters}), ctx)

    return run


def refusal(parse: Callable[[ProtocolContext, str], Job], ctx: ProtocolContext, adapters: str) -> str:
    with pytest.raises(InvalidRequest) as info:
        parse(ctx, adapters)
    assert (info.value.status, info.value.param) == (400, "adapters")
    return info.value.message


def test_an_adapter_on_a_model_served_without_one_is_refused_saying_how_to_serve_it(
    parse: Callable[[ProtocolContext, str], Job], ctx: ProtocolContext
) -> None:
    message = refusal(parse, ctx, "adapters/sql")
    assert "'adapters/sql'" in message and "served without an adapter" in message
    assert "--adapter-path" in message and "--adapter NAME=DIR" in message and '"BASE:NAME"' in message


def test_another_adapter_than_the_served_one_is_refused_naming_both(
    parse: Callable[[ProtocolContext, str], Job], ctx: ProtocolContext, tmp_path: Path
) -> None:
    (tmp_path / "served").mkdir()
    (tmp_path / "other").mkdir()
    served = dataclasses.replace(ctx, adapter=str(tmp_path / "served"))
    message = refusal(parse, served, str(tmp_path / "other"))
    assert str(tmp_path / "other") in message and str(tmp_path / "served") in message


def test_the_served_adapter_is_accepted_however_its_path_is_spelled(
    parse: Callable[[ProtocolContext, str], Job],
    ctx: ProtocolContext,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    folder = tmp_path / "adapters" / "sql"
    folder.mkdir(parents=True)
    (tmp_path / "link").symlink_to(folder)
    served = dataclasses.replace(ctx, adapter=str(folder))
    monkeypatch.chdir(tmp_path)
    plain = parse(ctx, "").request  # an empty field is no adapter, as mlx_lm.server reads it
    for spelling in (
        str(folder),
        f"{folder}/",
        "adapters/sql",
        "./adapters/../adapters/sql",
        str(tmp_path / "link"),
    ):
        assert parse(served, spelling).request.prompt_tokens == plain.prompt_tokens
