"""Responses over WebSocket, the parts without a server: a client message as a turn, and the
error event a refused turn gets (the real socket is tests/e2e/test_responses_websocket.py)."""

from __future__ import annotations

import orjson
import pytest

from mlx_serve.engine.errors import InvalidRequest, ServeError
from mlx_serve.protocols import openai_responses
from mlx_serve.protocols.contract import NotFound, SseComment, SseEvent
from mlx_serve.server.responses_socket import error_event, turn_of
from mlx_serve.server.writer import websocket_text

FORMAT = openai_responses.OpenAIResponses()


def test_a_create_message_is_a_streamed_post_body() -> None:
    turn = turn_of(b'{"type": "response.create", "model": "m", "input": "hi", "stream": false}')
    assert turn.generate and orjson.loads(turn.body) == {"model": "m", "input": "hi", "stream": True}
    warm = turn_of('{"type": "response.create", "input": "hi", "generate": false}')
    assert not warm.generate and "generate" not in orjson.loads(warm.body)


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (b'{"type": "response.cancel"}', "type"),
        (b'{"input": "hi"}', "type"),
        (b'{"type": "response.create", "background": true}', "background"),
        (b'{"type": "response.create", "generate": "no"}', "generate"),
        (b"[1, 2]", None),
        (b"not json", None),
    ],
)
def test_anything_else_is_refused_by_name(message: bytes, param: str | None) -> None:
    with pytest.raises(InvalidRequest) as info:
        turn_of(message)
    assert info.value.param == param


def test_the_error_event_carries_the_http_status_and_error_object() -> None:
    event = error_event(FORMAT, InvalidRequest("`temperature` must be at most 2", param="temperature"))
    assert event == {
        "type": "error",
        "status": 400,
        "error": {
            "message": "`temperature` must be at most 2",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": None,
        },
    }
    lost: ServeError = NotFound("Previous response with id 'r' not found.", param="previous_response_id")
    assert error_event(FORMAT, lost)["error"]["code"] == "previous_response_not_found"


def test_a_socket_message_is_an_events_json_and_nothing_sse_only() -> None:
    assert orjson.loads(websocket_text(SseEvent({"type": "response.created"}, "response.created")) or "") == {
        "type": "response.created"
    }
    assert websocket_text(SseEvent("[DONE]")) is None and websocket_text(SseComment("keep-alive")) is None
