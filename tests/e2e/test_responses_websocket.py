"""Tier 3: Responses over WebSocket against a real Hypercorn and the real default model.

The clients are real: the openai SDK's own `responses.connect()` (over the `websockets`
package) and `websockets` itself for what the SDK does not send. The Open Responses
compliance suite's WebSocket tests are not published on npm or PyPI, so these stand in for
them: the same events as the SSE stream, continuation with `previous_response_id`, the error
event for a refused turn (the socket stays open), keys on the handshake, a client that leaves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.support.server_proc import ServerProcess

TERMINAL = ("response.completed", "response.incomplete", "response.failed", "error")
ASK: Any = {
    "model": "m",
    "input": "What is the capital of France?",
    "max_output_tokens": 12,
    "temperature": 0,
}


def ws_url(server: ServerProcess) -> str:
    return server.url.replace("http://", "ws://") + "/v1/responses"


def one_turn(ws: ClientConnection, **fields: Any) -> list[dict[str, Any]]:
    """Send a response.create; its events up to the terminal one."""
    ws.send(json.dumps({"type": "response.create", **fields}))
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] not in TERMINAL:
        events.append(json.loads(ws.recv(timeout=120)))
    return events


def sse_events(server: ServerProcess, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True}, timeout=120) as r:
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    return [json.loads(d) for d in data if d != "[DONE]"]


def sdk_turn(socket: Any) -> list[Any]:
    """The SDK connection's events up to the terminal one."""
    events = [socket.recv()]
    while events[-1].type not in TERMINAL:
        events.append(socket.recv())
    return events


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


@pytest.fixture(scope="module")
def keyed(smollm_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("logs") / "ws-keyed.log"
    server = ServerProcess(["--model", str(smollm_path), "--api-key", "sekrit"], log)
    yield server
    server.close()


def test_the_sdks_socket_gets_the_streams_events_and_continues(smollm_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0)
    over_http = sse_events(smollm_server, ASK)
    with client.responses.connect() as socket:
        socket.send({"type": "response.create", **ASK})
        first = sdk_turn(socket)
        done = first[-1]
        assert done.type == over_http[-1]["type"]
        assert [e.type for e in first] == [e["type"] for e in over_http]  # the SSE stream's events
        assert done.response.output_text == text_of(over_http)  # greedy: the same answer
        follow: Any = {**ASK, "input": [{"role": "user", "content": "And of Spain?"}]}
        socket.send({"type": "response.create", **follow, "previous_response_id": done.response.id})
        second = sdk_turn(socket)[-1]
    assert second.response.previous_response_id == done.response.id
    assert second.response.usage is not None and done.response.usage is not None
    # The conversation came from the store and its prefix from the cache, as over HTTP.
    assert second.response.usage.input_tokens > done.response.usage.input_tokens
    assert second.response.usage.input_tokens_details.cached_tokens > 0
    lines = [ln for ln in smollm_server.log().splitlines() if "method=WS " in ln]
    assert any(f"id={done.response.id} " in ln and "status=200" in ln for ln in lines)


def test_a_refused_turn_is_an_error_event_and_the_socket_stays_open(smollm_server: ServerProcess) -> None:
    with connect(ws_url(smollm_server)) as ws:
        [bad] = one_turn(ws, **{**ASK, "temperature": 5})
        assert bad["type"] == "error" and bad["status"] == 400 and bad["error"]["param"] == "temperature"
        [kind] = one_turn(ws, **{**ASK, "type": "response.cancel"})
        assert kind["status"] == 400 and kind["error"]["param"] == "type"
        bad_schema = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}
        [grammar] = one_turn(ws, **ASK, text=bad_schema)
        assert grammar["status"] == 400 and grammar["error"]["param"].startswith("text.format")
        [lost] = one_turn(ws, **ASK, previous_response_id="resp_gone")
        assert lost["status"] == 404 and lost["error"]["code"] == "previous_response_not_found"
        events = one_turn(ws, **ASK)  # the same socket still serves
        assert events[-1]["type"] in ("response.completed", "response.incomplete")


def test_generate_false_completes_at_once_and_can_be_continued(smollm_server: ServerProcess) -> None:
    with connect(ws_url(smollm_server)) as ws:
        warm = one_turn(ws, **ASK, generate=False)
        assert [e["type"] for e in warm] == ["response.created", "response.in_progress", "response.completed"]
        assert warm[-1]["response"]["output"] == []
        follow = one_turn(
            ws, **{**ASK, "input": "Answer now."}, previous_response_id=warm[-1]["response"]["id"]
        )
    assert follow[-1]["type"] in ("response.completed", "response.incomplete") and text_of(follow)


def test_the_handshake_needs_the_key(keyed: ServerProcess) -> None:
    with pytest.raises(InvalidStatus) as info:
        connect(ws_url(keyed)).close()
    assert info.value.response.status_code == 401
    assert json.loads(info.value.response.body or b"{}")["error"]["code"] == "invalid_api_key"
    with connect(ws_url(keyed), additional_headers={"Authorization": "Bearer sekrit"}) as ws:
        assert one_turn(ws, **ASK)[-1]["type"] in ("response.completed", "response.incomplete")


def test_a_client_that_leaves_mid_answer_stops_the_engine(smollm_server: ServerProcess) -> None:
    before = smollm_server.stats()
    with connect(ws_url(smollm_server)) as ws:
        ws.send(
            json.dumps(
                {"type": "response.create", **ASK, "max_output_tokens": 2000, "input": "Tell a long story."}
            )
        )
        while json.loads(ws.recv(timeout=120))["type"] != "response.output_text.delta":
            pass
    deadline = time.monotonic() + 10
    while smollm_server.stats()["requests_aborted"] == before["requests_aborted"]:
        assert time.monotonic() < deadline, "the engine never saw the client leave"
        time.sleep(0.05)
    settled = smollm_server.stats()["generated_tokens"]
    time.sleep(0.5)
    assert smollm_server.stats()["generated_tokens"] == settled
    assert int(str(settled)) - int(str(before["generated_tokens"])) < 200


def test_a_socket_elsewhere_is_refused(smollm_server: ServerProcess) -> None:
    with pytest.raises(InvalidStatus) as info:
        connect(smollm_server.url.replace("http://", "ws://") + "/v1/chat/completions").close()
    assert info.value.response.status_code == 403


def test_an_unstored_response_continues_on_its_own_socket_only(smollm_server: ServerProcess) -> None:
    with connect(ws_url(smollm_server)) as ws:
        first = one_turn(ws, **ASK, store=False)[-1]["response"]
        follow = one_turn(ws, **{**ASK, "input": "Again."}, store=False, previous_response_id=first["id"])
        assert follow[-1]["type"] in ("response.completed", "response.incomplete")
    assert httpx.get(f"{smollm_server.url}/v1/responses/{first['id']}").status_code == 404  # never stored
    with connect(ws_url(smollm_server)) as other:
        [lost] = one_turn(other, **ASK, previous_response_id=first["id"])
    assert lost["status"] == 404 and lost["error"]["code"] == "previous_response_not_found"


def test_a_client_far_ahead_of_its_turns_is_closed(smollm_server: ServerProcess) -> None:
    long: Any = {"type": "response.create", **ASK, "max_output_tokens": 2000, "input": "Tell a long story."}
    with connect(ws_url(smollm_server)) as ws:
        for _ in range(40):  # a turn runs, 16 may wait, the one after closes the socket
            ws.send(json.dumps(long))
        with pytest.raises(ConnectionClosed) as info:
            while True:
                ws.recv(timeout=120)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1008
