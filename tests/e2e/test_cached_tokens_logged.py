"""Tier 3: what the prefix cache served a request is in its access log line, and in its usage,
through a real Hypercorn on the real default model — a request whose client left mid-answer too
(its line is written from the engine's note at admission, not from a usage it never got)."""

from __future__ import annotations

import re
import time

import httpx
import openai

from tests.support.server_proc import ServerProcess

PROMPT = [{"role": "user", "content": "Tell me about the history of bread, in many words. " * 8}]


def line_for(server: ServerProcess, request_id: str) -> str:
    for _ in range(100):
        lines = [ln for ln in server.log().splitlines() if f"request id={request_id} " in ln]
        if lines:
            return lines[0]
        time.sleep(0.1)
    raise AssertionError(f"no access log line for {request_id}")


def test_a_repeated_prefix_reports_cached_tokens_finished_and_aborted(smollm_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0)
    first = client.chat.completions.create(model="m", messages=PROMPT, max_tokens=4)
    again = client.chat.completions.create(model="m", messages=PROMPT, max_tokens=4)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    cached = again.usage.prompt_tokens_details.cached_tokens or 0
    assert cached > 0 and cached < again.usage.prompt_tokens  # all but the prompt's last token
    assert f"cached_tokens={cached} " in line_for(smollm_server, again.id)
    assert first.usage is not None and first.usage.prompt_tokens == again.usage.prompt_tokens

    body = {"model": "m", "messages": PROMPT, "max_tokens": 400, "stream": True}
    with httpx.stream("POST", smollm_server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():  # the first token, then the client leaves
            flat = line.replace(" ", "")
            if '"content":"' in flat and '"content":""' not in flat:
                request_id = re.search(r'"id":\s*"([^"]+)"', line).group(1)  # type: ignore[union-attr]
                break
    left = line_for(smollm_server, request_id)
    assert "finish=abort" in left and f"cached_tokens={cached} " in left, left
