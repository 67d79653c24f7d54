"""What every rank does at start, in the same order (each step below is a collective or none)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from engine.loader import ModelSpec
from engine.shard import ShardMode, ShardRefused
from engine.types import Counters

if TYPE_CHECKING:
    from engine.build import EngineSettings
    from engine.core import Core
    from engine.shard.channel import Channel


def sharded_settings(settings: EngineSettings) -> EngineSettings:
    """The settings every rank runs: no server-wide drafter, and a request's own prediction
    speculates ungated (the gate decides from timings, which differ per rank)."""
    if settings.draft_kind is not None or settings.draft_spec is not None:
        raise ShardRefused(
            "speculative decoding (--draft-model, --draft-kind) cannot be combined with --shard"
        )
    return replace(settings, speculation_gated=False)


def start_rank(counters: Counters, spec: ModelSpec, settings: EngineSettings) -> tuple[Core, Channel]:
    """Join the group, agree on settings and seed, load this rank's shard, build the same core as
    every other rank (memory agreed over the group) and open the step channel."""
    import mlx.core as mx

    from engine.build import describe, make_core
    from engine.shard.channel import Channel
    from engine.shard.group import MemoryAgreement, handshake, join_group
    from engine.shard.load import load_shard

    assert settings.shard is not None
    mode = ShardMode(settings.shard)
    settings = sharded_settings(settings)
    group = join_group()
    seed = handshake(group, settings, spec.path)
    mx.random.seed(seed)
    loaded = load_shard(spec, mode, group)
    print(describe(loaded), flush=True)
    core = make_core(loaded, counters, settings, spec.adapter_path, None, shard=MemoryAgreement(group))
    return core, Channel(group)
