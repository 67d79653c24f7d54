"""Anthropic message threads (the `message-threads-2026-08-12` beta): server-held conversations.

`thread: {"type": "create"}` answers as usual and keeps the conversation (system, tools, the
messages and the reply) under the reply's `id`; `{"type": "continue", "previous_message_id":
…}` sends only the new turn's messages, and the thread gives the rest: its system and tools
(create-only fields: giving them again is refused by name) and its history. A reply is
continued once: the turn that continues it takes its place. Threads live in a ResponsesStore
(the one `previous_response_id` uses), with its per-key isolation, time to live and byte cap.
Errors carry the `error.details.error_code` the SDK acts on (`thread_not_found`: replay the
whole conversation under a new thread; `thread_already_continued`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import Struct, structs

from mlx_serve.engine.errors import InvalidRequest
from mlx_serve.protocols.anthropic_request import (
    ContentBlock,
    InputMessage,
    PromptBody,
    TextBlock,
    ThreadCreate,
    Tool,
)
from mlx_serve.protocols.contract import NotFound
from mlx_serve.protocols.responses_store import ResponsesStore

CREATE_ONLY = ("system", "tools")
CONTINUED_KEPT = 4096  # continued reply ids remembered, to tell "already continued" from "gone"


class Thread(Struct, frozen=True):
    """What a thread keeps: its create-only fields and the conversation so far."""

    messages: list[InputMessage]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None


_THREAD = msgspec.json.Decoder(Thread)
_BLOCKS = msgspec.json.Decoder(list[ContentBlock])


@dataclass(frozen=True, slots=True)
class ThreadTurn:
    """A request on a thread, as the job carries it: the whole conversation it answered and
    the reply it continues (None: it creates the thread)."""

    thread: Thread
    previous_id: str | None


class ThreadNotFound(NotFound):
    def __init__(self, message_id: str) -> None:
        super().__init__(
            f"no thread holds the message '{message_id}' (it expired, was evicted, or is another key's); "
            'send the whole conversation with thread: {"type": "create"}',
            param="thread.previous_message_id",
        )
        self.details = {"error_code": "thread_not_found"}


class ThreadAlreadyContinued(InvalidRequest):
    def __init__(self, message_id: str) -> None:
        super().__init__(
            f"the message '{message_id}' was already continued; continue from the thread's latest message",
            param="thread.previous_message_id",
        )
        self.details = {"error_code": "thread_already_continued"}


class ThreadStore:
    """Threads by the id of their latest reply, per principal, in a bounded ResponsesStore."""

    def __init__(self, store: ResponsesStore | None = None) -> None:
        self.store = store if store is not None else ResponsesStore()
        self._continued: OrderedDict[str, None] = OrderedDict()

    def turn(self, req: PromptBody, owner: str) -> tuple[PromptBody, ThreadTurn | None]:
        """The request with its thread's system, tools and history in place, and the turn to
        keep once answered (None: the request is not on a thread)."""
        thread = req.thread
        if thread is None:
            return req, None
        if isinstance(thread, ThreadCreate):
            return req, ThreadTurn(Thread(list(req.messages), req.system, req.tools), None)
        previous = thread.previous_message_id
        for field in CREATE_ONLY:
            if getattr(req, field) is not None:
                raise InvalidRequest(
                    f"`{field}` cannot be given when continuing a thread: it keeps the one it was created with",
                    param=field,
                )
        held = self._get(previous, owner)
        messages = held.messages + list(req.messages)
        full = structs.replace(req, messages=messages, system=held.system, tools=held.tools)
        return full, ThreadTurn(Thread(messages, held.system, held.tools), previous)

    def keep(self, message_id: str, turn: ThreadTurn, reply: list[dict[str, Any]], owner: str) -> None:
        """Keep the thread under the reply's id; the reply it continued is then spent."""
        content = _BLOCKS.decode(msgspec.json.encode(reply))
        answered = [*turn.thread.messages, InputMessage("assistant", content)]
        body = msgspec.json.encode(structs.replace(turn.thread, messages=answered))
        self.store.put(message_id, body, (), len(body), owner=owner)
        if turn.previous_id is not None and self.store.delete(turn.previous_id, owner):
            self._continued[f"{owner}/{turn.previous_id}"] = None
            while len(self._continued) > CONTINUED_KEPT:
                self._continued.popitem(last=False)

    def _get(self, message_id: str, owner: str) -> Thread:
        stored = self.store.get(message_id, owner)
        if stored is not None:
            return _THREAD.decode(stored.body)
        if f"{owner}/{message_id}" in self._continued:
            raise ThreadAlreadyContinued(message_id)
        raise ThreadNotFound(message_id)
