"""What every rank does at start, in the same order (each step below is a collective or none)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mlx_serve.engine.host.shard import GROUP_LOST_EXIT, ShardMode, ShardRefused
from mlx_serve.engine.model.loader import ModelSpec
from mlx_serve.engine.types import Counters

if TYPE_CHECKING:
    from mlx_serve.engine.batch.core import Core
    from mlx_serve.engine.host.settings import EngineSettings
    from mlx_serve.engine.host.shard.channel import Channel


def sharded_settings(settings: EngineSettings) -> EngineSettings:
    """The settings every rank runs: no server-wide drafter, and a request's own prediction
    speculates ungated (the gate decides from timings, which differ per rank)."""
    if settings.draft_kind is not None or settings.draft_spec is not None:
        raise ShardRefused(
            "speculative decoding (--draft-model, --draft-kind) cannot be combined with --shard"
        )
    return replace(settings, speculation_gated=False)


def start_rank(counters: Counters, spec: ModelSpec, settings: EngineSettings) -> tuple[Core, Channel]:
    """Join the group, agree on settings and seed, watch the other ranks, load this rank's shard,
    build the same core as every other rank (memory agreed over the group), open the channel."""
    import mlx.core as mx

    from mlx_serve.engine.host.assemble import describe, make_core
    from mlx_serve.engine.host.shard.channel import Channel
    from mlx_serve.engine.host.shard.group import MemoryAgreement, join_group
    from mlx_serve.engine.host.shard.load import load_shard

    assert settings.shard is not None
    mode = ShardMode(settings.shard)
    settings = sharded_settings(settings)
    group = join_group()
    seed = watch_group(group, settings, spec)
    mx.random.seed(seed)
    loaded = load_shard(spec, mode, group)
    print(describe(loaded), flush=True)
    core = make_core(loaded, counters, settings, None, shard=MemoryAgreement(group))
    return core, Channel(group)


def watch_group(group: Any, settings: EngineSettings, spec: ModelSpec) -> int:
    """The handshake, then a liveness connection from each follower to rank 0: from here on a
    rank that dies ends every other rank's process (GROUP_LOST_EXIT). Returns the seed."""
    from mlx_serve.engine.host.shard import watch
    from mlx_serve.engine.host.shard.group import handshake, leader_address

    address = leader_address()
    server = watch.listen(address) if group.rank() == 0 else None
    seed, port = handshake(group, settings, spec.path, server.getsockname()[1] if server else 0)
    if server is not None:
        peers = watch.accept_followers(server, group.size() - 1)
    else:
        peers = {0: watch.connect_leader(address, port, group.rank())}
    watch.watch(peers, watch.print_and_exit(GROUP_LOST_EXIT))
    return seed
