"""Tier 3: the prompt cache's disk tier across a restart of the real server (real Hypercorn, the
real default model, the openai SDK): a long prompt served before starts from disk, and greedy
text is the same as when it was computed."""

from __future__ import annotations

import time
from pathlib import Path

import openai

from tests.support.server_proc import ServerProcess

NOTES = " ".join(f"Note {i}: the service keeps record {i * 37 % 101} in table {i % 7}." for i in range(34))
MESSAGES = [{"role": "system", "content": NOTES}, {"role": "user", "content": "Which table holds record 37?"}]


def ask(server: ServerProcess) -> tuple[str, int, int]:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=24, temperature=0)  # type: ignore[arg-type]
    assert r.usage is not None and r.usage.prompt_tokens_details is not None
    return (
        r.choices[0].message.content or "",
        r.usage.prompt_tokens,
        r.usage.prompt_tokens_details.cached_tokens or 0,
    )


def test_a_prompt_served_before_a_restart_starts_from_disk_with_the_same_greedy_text(
    smollm_path: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "prompt-cache"
    args = ["--model", str(smollm_path), "--prompt-cache-dir", str(folder)]
    first = ServerProcess(args, tmp_path / "first.log")
    try:
        text, prompt_tokens, cached = ask(first)
        assert prompt_tokens > 512 and cached == 0
        deadline = time.monotonic() + 60  # the writer thread's files, off the step's path
        while len(list(folder.glob("*/*.safetensors"))) < prompt_tokens // 256:
            assert time.monotonic() < deadline, list(folder.rglob("*"))
            time.sleep(0.2)
    finally:
        first.close()
    again = ServerProcess(args, tmp_path / "again.log")
    try:
        text_again, _, cached = ask(again)
    finally:
        again.close()
    assert cached >= (prompt_tokens // 256) * 256  # every full block of the prompt, from disk
    assert text_again == text
