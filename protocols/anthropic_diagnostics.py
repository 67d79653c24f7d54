"""Why the prefix cache missed: Anthropic's `diagnostics.cache_miss_reason` (the
`cache-diagnosis-2026-04-07` beta).

A request opts in with `diagnostics: {"previous_message_id": "msg_…" | null}`, or with the beta
in its `anthropic-beta` header (then it is compared with the previous request of the same API
key and model). Each opted-in request leaves a print of its prompt (model, system, tools, each
message, the other prompt-shaping fields, its length) in a bounded store; the answer compares
the two prints and the engine's usage:

- `previous_message_not_found`: the named message is not (or no longer) kept;
- `model_changed`, `tools_changed`, `system_changed`, `messages_changed` (an earlier message
  differs instead of new ones being appended), in the prompt's order; `unavailable` when only
  other prompt-shaping fields (thinking, tool choice) differ;
- ours, when the prompt extends the previous one yet the cache missed: `evicted` (its blocks
  were cached and are gone) or `cold` (none of it was ever cached, e.g. after a restart).

`cache_missed_input_tokens` is the previous prompt's length (the shorter prompt's, for ours)
less the tokens read from the cache. No miss: `diagnostics` is null. A stream's
`message_start` says `{"cache_miss_reason": null}` (pending, as Anthropic's does) and its
`message_delta` carries the diagnosis.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import msgspec

from mlx_serve.engine.types import CacheMiss, Usage
from mlx_serve.protocols.anthropic_request import PromptBody

BETA = "cache-diagnosis-2026-04-07"
KEPT = 1024  # prints kept, oldest first out (each is a few hundred bytes)


@dataclass(frozen=True, slots=True)
class PromptPrint:
    """What a request's prompt was made of, as digests."""

    model: str
    tools: bytes
    system: bytes
    messages: tuple[bytes, ...]
    other: bytes
    tokens: int


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A request against the one before it: the reason its prompt changed (None: it extends
    it), or not found; the previous prompt's length."""

    changed: str | None
    previous_tokens: int = 0
    not_found: bool = False

    def log_fields(self) -> tuple[tuple[str, str], ...]:
        """What the access log says of it before the answer (the engine's miss kind comes after)."""
        reason = "previous_message_not_found" if self.not_found else self.changed
        return (("cache_miss_reason", reason),) if reason else ()

    def json(self, usage: Usage) -> dict[str, Any] | None:
        """The response's `diagnostics` (None: no miss to report)."""
        if self.not_found:
            return {"cache_miss_reason": {"type": "previous_message_not_found"}}
        if self.changed == "unavailable":
            return {"cache_miss_reason": {"type": "unavailable"}}
        reason, shared = self.changed, self.previous_tokens
        if reason is None:
            reason = {CacheMiss.EVICTED: "evicted", CacheMiss.COLD: "cold"}.get(usage.cache_miss)  # type: ignore[arg-type]
            shared = min(shared, usage.prompt_tokens)
        missed = shared - usage.cached_tokens
        if reason is None or missed <= 0:
            return None
        return {"cache_miss_reason": {"type": reason, "cache_missed_input_tokens": missed}}


PENDING: dict[str, Any] = {"cache_miss_reason": None}


def _digest(value: Any) -> bytes:
    return hashlib.blake2b(msgspec.json.encode(value), digest_size=16).digest()


def prompt_print(req: PromptBody, system: str, other: Any, tokens: int) -> PromptPrint:
    """The print of a rendered request: `system` as it reached the prompt, `other` the other
    fields that shape it."""
    messages = tuple(_digest(m) for m in req.messages)
    return PromptPrint(req.model, _digest(req.tools), _digest(system), messages, _digest(other), tokens)


def compare(old: PromptPrint, new: PromptPrint) -> str | None:
    """The first thing, in the prompt's order, that differs; None when `new` extends `old`."""
    if old.model != new.model:
        return "model_changed"
    if old.tools != new.tools:
        return "tools_changed"
    if old.system != new.system:
        return "system_changed"
    if new.messages[: len(old.messages)] != old.messages:
        return "messages_changed"
    return "unavailable" if old.other != new.other else None


class CacheDiagnoser:
    """The prints of recent opted-in requests, by message id and by (key, model) for the last.
    Requests are parsed on worker threads: one lock keeps the two maps in step."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._lock = threading.Lock()
        self._prints: OrderedDict[tuple[str, str], PromptPrint] = OrderedDict()
        self._last: OrderedDict[tuple[str, str], str] = OrderedDict()

    def diagnose(
        self, message_id: str, owner: str, named: str | None, by_header: bool, now: PromptPrint
    ) -> Diagnosis:
        """Compare with the message `named` (by_header: with the key's last for the model), then
        keep this request's print under `message_id`."""
        previous_id = (
            named if named is not None else (self._last.get((owner, now.model)) if by_header else None)
        )
        old = None if previous_id is None else self._prints.get((owner, previous_id))
        self._keep(message_id, owner, now)
        if named is not None and old is None:
            return Diagnosis(None, not_found=True)
        if old is None:
            return Diagnosis(None)
        return Diagnosis(compare(old, now), old.tokens)

    def _keep(self, message_id: str, owner: str, now: PromptPrint) -> None:
        self._prints[(owner, message_id)] = now
        self._last[(owner, now.model)] = message_id
        self._last.move_to_end((owner, now.model))
        while len(self._prints) > self.kept:
            self._prints.popitem(last=False)
        while len(self._last) > self.kept:
            self._last.popitem(last=False)
