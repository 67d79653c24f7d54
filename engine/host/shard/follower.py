"""Ranks ≠ 0: no HTTP, no scheduler; the same runner steps rank 0 publishes, until the group ends."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

from mlx_serve.engine.host.shard import GROUP_LOST_EXIT
from mlx_serve.engine.host.shard.channel import Admit, Channel, Message, Reset, Step, checksum
from mlx_serve.engine.types import Counters

if TYPE_CHECKING:
    from mlx_serve.engine.batch.core_parts import PrefixLookup, Runner
    from mlx_serve.engine.host.settings import EngineSettings, ModelSource

log = logging.getLogger("mlx_serve.shard")


class Diverged(Exception):
    """This rank no longer matches rank 0 (other tokens, another cached prefix): the group is lost."""


class Follower:
    """Mirrors rank 0's runner: admits what it admitted, steps what it stepped."""

    def __init__(self, runner: Runner, prefix_cache: PrefixLookup | None, tokenizer: Any) -> None:
        self.runner = runner
        self.prefix_cache = prefix_cache
        self.tokenizer = tokenizer
        self._grammar: Any = None
        self._checksum: int | None = None
        self.steps = 0

    def handle(self, message: Message) -> None:
        if isinstance(message, Reset):
            self._checksum = None
            self.runner.reset()
            return
        if message.checksum is not None and message.checksum != self._checksum:
            raise Diverged(f"step {self.steps}: this rank sampled other tokens than rank 0")
        for admit in message.admits:
            self._admit(admit)
        self._step(message)

    def _step(self, message: Step) -> None:
        self.steps += 1
        try:
            self._checksum = checksum(self.runner.step(message.plan))
        except Exception:  # rank 0 fails the same way and resets; the checksum tells if not
            log.exception("step %s failed", self.steps)
            self._checksum = None

    def _admit(self, admit: Admit) -> None:
        request = admit.request
        cache, found = None, 0
        if self.prefix_cache is not None:
            cache, found = self.prefix_cache.lookup(request.prompt_tokens)
        if found != admit.num_cached:
            raise Diverged(
                f"request {request.id}: this rank's prefix cache holds {found} of its prompt tokens, "
                f"rank 0's {admit.num_cached}"
            )
        self.runner.admit(request, cache, found, self._constraint(request))

    def _constraint(self, request: Any) -> Any:
        if request.grammar is None:
            return None
        if self._grammar is None:
            from mlx_serve.engine.rows.grammar import GrammarTokenizer

            self._grammar = GrammarTokenizer(self.tokenizer)
        return self._grammar.constraint(request.grammar)


def follow(channel: Channel, follower: Follower) -> int:
    """Handle rank 0's messages until the group ends; the process's exit status."""
    while True:
        try:
            message = channel.receive()
        except RuntimeError as exc:
            print(f"mlx-serve: rank {channel.rank}: the group ended: {exc}", file=sys.stderr, flush=True)
            return GROUP_LOST_EXIT
        try:
            follower.handle(message)
        except Diverged as exc:
            print(f"mlx-serve: rank {channel.rank}: {exc}; leaving the group", file=sys.stderr, flush=True)
            return GROUP_LOST_EXIT


def serve_follower(settings: EngineSettings, source: ModelSource) -> int:
    """A follower rank's whole life: find the model, start like every rank, then follow."""
    from mlx_serve.engine.host.shard import ShardRefused
    from mlx_serve.engine.host.shard.rank import start_rank

    try:
        spec = source.model_spec()  # before joining: a slow conversion must not hold the others
        core, channel = start_rank(Counters(), spec, settings)
    except ShardRefused as exc:
        print(f"mlx-serve: cannot serve: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"mlx-serve: rank {channel.rank} of {channel.group.size()} ready; following rank 0", flush=True)
    return follow(channel, Follower(core.runner, core.prefix_cache, core.tokenizer))
