"""Finished responses by id: GET /v1/responses/{id}, `previous_response_id`, `item_reference`."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mlx_serve.protocols.responses_input import InputItem

MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: bytes
    conversation: tuple[InputItem, ...]
    size: int
    expires_at: float
    items: Mapping[str, InputItem] = field(default_factory=dict)  # its output items, by id
    owner: str = ""  # the principal that made it (protocols.contract.ProtocolContext.principal)


class ResponsesStore:
    """Finished responses by id; event-loop only.

    Entries live `ttl_s` seconds; past `max_bytes` in all, the oldest go first. A conversation
    shares its earlier items with the response it continues, so `size` counts what is new. A
    response's output items can be referenced by id (`item_reference`) while it is kept.
    """

    def __init__(
        self, ttl_s: float = 3600.0, max_bytes: int = 256 * MIB, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._item_owner: dict[str, str] = {}
        self.bytes_used = 0

    def put(
        self,
        response_id: str,
        body: bytes,
        conversation: tuple[InputItem, ...],
        size: int,
        items: Mapping[str, InputItem] | None = None,
        owner: str = "",
    ) -> None:
        if size > self.max_bytes:
            return
        self.delete(response_id, owner)
        expires = self._clock() + self.ttl_s
        entry = StoredResponse(body, conversation, size, expires, dict(items or {}), owner)
        self._entries[response_id] = entry
        self._item_owner.update(dict.fromkeys(entry.items, response_id))
        self.bytes_used += size
        self._evict()

    def get(self, response_id: str, owner: str = "") -> StoredResponse | None:
        """The response, if it is kept and `owner` made it (another's is as good as absent)."""
        self._evict()
        entry = self._entries.get(response_id)
        return entry if entry is not None and entry.owner == owner else None

    def item(self, item_id: str, owner: str = "") -> InputItem | None:
        """An output item of a kept response of `owner`'s, by its id."""
        entry = self.get(self._item_owner.get(item_id, ""), owner)
        return None if entry is None else entry.items.get(item_id)

    def delete(self, response_id: str, owner: str = "") -> bool:
        kept = self._entries.get(response_id)
        if kept is None or kept.owner != owner:
            return False
        entry = self._entries.pop(response_id, None)
        if entry is not None:
            self.bytes_used -= entry.size
            for item_id in entry.items:
                self._item_owner.pop(item_id, None)
        return entry is not None

    def __len__(self) -> int:
        return len(self._entries)

    def _evict(self) -> None:
        now = self._clock()
        while self._entries:
            oldest_id, oldest = next(iter(self._entries.items()))
            if oldest.expires_at > now and self.bytes_used <= self.max_bytes:
                return
            self.delete(oldest_id, oldest.owner)
