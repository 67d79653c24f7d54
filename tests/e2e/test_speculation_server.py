"""Tier 3: speculative decoding behind a real server, through the real openai SDK.

The server drafts with prompt lookup (`--draft-kind ngram`); greedy text must equal mlx-lm's
plain greedy text, usage must report the speculation, Predicted Outputs must count accepted
prediction tokens, and a draft model with another tokenizer must stop the server at start.
The server runs with `--speculation-gate off`: the timing gate may learn that plain decoding
wins on this CPU and skip a short request's drafts, and these tests assert that drafts happen.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.server_proc import ServerProcess

COPY = [
    {
        "role": "user",
        "content": "Copy this list exactly: apples, oranges, pears, plums, grapes, "
        "cherries, apples, oranges, pears, plums.",
    }
]


@pytest.fixture(scope="module")
def server(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "speculation-server.log"
    proc = ServerProcess(
        [
            "--model",
            str(smollm_path),
            "--draft-kind",
            "ngram",
            "--num-draft-tokens",
            "3",
            "--speculation-gate",
            "off",
        ],
        log,
    )
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def expected(oracle: Any) -> str:
    return str(oracle(COPY, max_tokens=40)[0])


def speculation(usage: Any) -> dict[str, Any]:
    return dict((usage.model_extra or {}).get("speculation") or {})


def test_speculative_chat_is_plain_greedy_text_and_reports_its_drafts(
    client: openai.OpenAI, expected: str
) -> None:
    r = client.chat.completions.create(model="default", messages=COPY, max_tokens=40, temperature=0)
    assert r.choices[0].message.content == expected
    spec = speculation(r.usage)
    # (whether the copies get accepted before the server's gate weighs speculation against
    # plain steps is timing; that drafts were verified and counted is not)
    assert spec["drafted"] > 0 and 0 <= spec["accepted"] <= spec["drafted"]
    assert spec["acceptance_rate"] == round(spec["accepted"] / spec["drafted"], 4)
    # streamed: the same text, and the usage chunk carries the same extension
    stream = client.chat.completions.create(
        model="default",
        messages=COPY,
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert speculation(chunks[-1].usage)["drafted"] > 0


def test_predicted_outputs_count_accepted_prediction_tokens(client: openai.OpenAI, expected: str) -> None:
    r = client.chat.completions.create(
        model="default",
        messages=COPY,
        max_tokens=40,
        temperature=0,
        prediction={"type": "content", "content": expected},
    )
    assert r.choices[0].message.content == expected
    details = r.usage.completion_tokens_details
    assert details is not None and details.accepted_prediction_tokens is not None
    assert details.accepted_prediction_tokens >= r.usage.completion_tokens // 2
    assert details.rejected_prediction_tokens is not None
    wrong = client.chat.completions.create(
        model="default",
        messages=COPY,
        max_tokens=40,
        temperature=0,
        prediction={"type": "content", "content": "Nothing like the answer at all, zebra quartz."},
    )
    assert wrong.choices[0].message.content == expected  # a bad prediction costs, never changes text


def test_num_draft_tokens_zero_turns_speculation_off_for_the_request(
    client: openai.OpenAI, expected: str
) -> None:
    r = client.chat.completions.create(
        model="default", messages=COPY, max_tokens=40, temperature=0, extra_body={"num_draft_tokens": 0}
    )
    assert r.choices[0].message.content == expected
    assert speculation(r.usage) == {}
    bad = httpx.post(
        str(client.base_url) + "chat/completions", timeout=30, json={"messages": COPY, "num_draft_tokens": 99}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "num_draft_tokens"


def test_anthropic_usage_and_metrics_count_speculation(server: ServerProcess) -> None:
    r = httpx.post(
        server.url + "/v1/messages", timeout=60, json={"model": "default", "max_tokens": 40, "messages": COPY}
    )
    assert r.status_code == 200 and r.json()["usage"]["speculation"]["drafted"] > 0
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    drafted = re.search(r"^mlx_serve:spec_decode_num_draft_tokens_total (\S+)$", metrics, re.MULTILINE)
    accepted = re.search(r"^mlx_serve:spec_decode_num_accepted_tokens_total (\S+)$", metrics, re.MULTILINE)
    assert drafted and accepted and float(drafted[1]) >= float(accepted[1]) > 0


def test_a_draft_model_with_another_tokenizer_refuses_to_start(
    tiny_path: Path, smollm_path: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other-tokenizer"
    shutil.copytree(tiny_path, other)
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab["zzqqxx"] = len(vocab)  # one token more: the ids no longer mean the same text
    (other / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(RuntimeError) as failed:
        ServerProcess(
            ["--model", str(smollm_path), "--draft-model", str(other)], tmp_path / "log", ready_timeout_s=240
        )
    assert "server exited 1" in str(failed.value)
    assert "does not share the model's tokenizer" in str(failed.value)
