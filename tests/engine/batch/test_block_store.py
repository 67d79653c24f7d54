"""Tier 1: the block store (engine.batch.block_store) and its disk tier (engine.batch.disk_tier):
chained keys, the longest cached run, shared blocks, LRU eviction block by block, room given
back to rows, and blocks on disk across a restart."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from mlx_serve.engine.batch.block_store import ROOT_KEY, BlockStore, block_key
from mlx_serve.engine.batch.disk_tier import DiskTier, fingerprint
from mlx_serve.engine.batch.scheduler import Scheduler, SchedulerConfig
from mlx_serve.engine.host.assemble import CacheRoom
from mlx_serve.engine.model.mlx_boundary import KVCache
from mlx_serve.engine.types import CacheMiss, Request

H, D, LAYERS, B = 2, 4, 2, 4  # four-token blocks


def row(tokens: list[int]) -> list[KVCache]:
    """A row's KV whose every position is a function of the token there and of its position,
    so a copy of the wrong block or of a block at the wrong place shows."""
    out = []
    for layer in range(LAYERS):
        base = mx.array([t * 1000 + i + layer * 0.5 for i, t in enumerate(tokens)], dtype=mx.float32)
        kv = mx.broadcast_to(base[None, None, :, None], (1, H, len(tokens), D))
        c = KVCache()
        c.update_and_fetch(kv, -kv)
        out.append(c)
    return out


def expect(found: list[Any] | None, tokens: list[int]) -> None:
    assert found is not None
    want = row(tokens)
    for got, w in zip(found, want):
        assert isinstance(got, KVCache) and got.offset == len(tokens)
        assert got.keys is not None and w.keys is not None and got.values is not None and w.values is not None
        assert mx.array_equal(got.keys[..., : got.offset, :], w.keys[..., : len(tokens), :]).item()
        assert mx.array_equal(got.values[..., : got.offset, :], w.values[..., : len(tokens), :]).item()


def block_bytes() -> int:
    return 2 * LAYERS * H * B * D * 4


def store(s: BlockStore, tokens: list[int]) -> None:
    s.store(tokens, row(tokens))  # type: ignore[arg-type]


def test_block_keys_chain_over_every_token_before_the_block() -> None:
    a = block_key(ROOT_KEY, (1, 2, 3, 4))
    assert block_key(a, (5, 6, 7, 8)) != block_key(block_key(ROOT_KEY, (9, 2, 3, 4)), (5, 6, 7, 8))
    assert block_key(a, (5, 6, 7, 8)) == block_key(block_key(ROOT_KEY, (1, 2, 3, 4)), (5, 6, 7, 8))


def test_lookup_copies_the_longest_cached_run_and_leaves_one_token() -> None:
    s = BlockStore(max_bytes=1 << 30, block_tokens=B)
    a = list(range(1, 11))  # two full blocks and a partial one of 2
    store(s, a)
    found, n = s.lookup((*a[:9], 99))  # all it shares: 9 tokens, into the partial block
    assert n == 9
    expect(found, a[:9])
    found, n = s.lookup(tuple(a))  # the whole of it: one token left to compute
    assert n == 9
    found, n = s.lookup((1, 2, 3, 4, 5, 77, 78, 79, 80))  # diverges inside the second block
    assert n == 5
    expect(found, a[:5])
    assert s.lookup((7, 7, 7)) == (None, 0) and s.last.miss is CacheMiss.COLD


def test_a_copy_has_room_for_the_rest_of_the_prompt() -> None:
    s = BlockStore(max_bytes=1 << 30, block_tokens=B)
    store(s, list(range(1, 9)))
    found, n = s.lookup((*range(1, 9), *range(300)))  # 300 tokens to prefill after the 8 found
    assert found is not None and n == 8
    for c in found:
        assert isinstance(c, KVCache) and c.keys is not None and c.offset == 8
        assert c.keys.shape[2] == 8 + 512  # mlx-lm's 256-slot steps: the prompt writes in place


def test_a_written_copy_leaves_the_stored_blocks_alone() -> None:
    s = BlockStore(max_bytes=1 << 30, block_tokens=B)
    a = list(range(1, 13))
    store(s, a)
    found, n = s.lookup((*a, 5))
    assert found is not None and n == 12
    for c in found:
        assert isinstance(c, KVCache)
        c.update_and_fetch(mx.zeros((1, H, 3, D)), mx.zeros((1, H, 3, D)))
    expect(s.lookup((*a, 5))[0], a)


def test_conversations_sharing_a_prefix_hold_its_blocks_once() -> None:
    s = BlockStore(max_bytes=1 << 30, block_tokens=B)
    system = list(range(100, 112))  # three blocks
    store(s, [*system, 1, 2, 3, 4])
    store(s, [*system, 5, 6, 7, 8])
    assert len(s) == 5 and s.nbytes == 5 * block_bytes()
    expect(s.lookup((*system, 5, 6, 7, 8, 0))[0], [*system, 5, 6, 7, 8])
    expect(s.lookup((*system, 1, 2, 3, 4, 0))[0], [*system, 1, 2, 3, 4])


def test_a_longer_row_replaces_the_partial_block_it_extends() -> None:
    s = BlockStore(max_bytes=1 << 30, block_tokens=B)
    store(s, [1, 2, 3, 4, 5, 6])
    store(s, [1, 2, 3, 4, 5, 6, 7])
    assert len(s) == 2  # the full block, and the longer partial one
    store(s, [1, 2, 3, 4, 5])  # held already by the longer one
    assert len(s) == 2
    assert s.lookup((1, 2, 3, 4, 5, 6, 7, 0))[1] == 7


def test_eviction_goes_block_by_block_least_recent_first_and_descendants_before_ancestors() -> None:
    s = BlockStore(max_bytes=1 << 30, block_tokens=B)
    old, new = [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 9, 9]
    store(s, old)
    store(s, new)
    s.fit(2 * block_bytes())  # one block must go: the end of the older chain, not its start
    assert len(s) == 2
    assert s.lookup((*old, 0))[1] == 4
    assert s.lookup((*new, 0))[1] == 4
    s.lookup((*old, 0))  # a hit is a use: now the other chain is the least recent
    s.fit(block_bytes())
    assert s.lookup((*new, 0)) == (None, 0) and s.last.miss is CacheMiss.EVICTED
    assert s.lookup((*old, 0))[1] == 4


def test_rows_that_need_kv_memory_evict_the_cache_and_get_it_back_when_they_leave() -> None:
    """CacheRoom: the store keeps to the KV the plan has less what running rows are charged for."""
    s = BlockStore(max_bytes=1 << 30, block_tokens=B)
    for i in range(6):
        store(s, [i * 100 + t for t in range(8)])  # 12 blocks
    per_token = block_bytes() // B

    class Plan:
        kv_capacity_tokens = 64
        kv = type("Kv", (), {"per_token": per_token, "window_per_token": 0})()

    room = CacheRoom(s, Plan())  # type: ignore[arg-type]
    sched = Scheduler(SchedulerConfig(kv_capacity_tokens=64), frozenset())
    room(sched.kv_slots_held())
    assert len(s) == 12  # 48 tokens: all fit beside no rows
    sched.add(Request("r", tuple(range(30)), max_tokens=10))
    sched.schedule()
    room(sched.kv_slots_held())  # the row is charged 40 slots: 24 are left
    assert s.nbytes <= 24 * per_token and len(s) == 6
    sched.abort("r")
    room(sched.kv_slots_held())
    assert s.limit_bytes == 64 * per_token


# -- the disk tier ---------------------------------------------------------------------


def settle(tier: DiskTier) -> None:
    deadline = time.monotonic() + 10
    while tier._pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not tier._pending


def test_evicted_blocks_spill_to_disk_and_serve_after_a_restart(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 30)
    s = BlockStore(max_bytes=1 << 30, block_tokens=B, disk=tier)
    a = list(range(1, 14))  # three full blocks and one token
    store(s, a)
    s.fit(0)  # memory pressure: every block goes; the full ones to disk
    assert len(s) == 0
    settle(tier)
    assert len(list(tmp_path.glob("*.safetensors"))) == 3
    tier.close()

    again = BlockStore(max_bytes=1 << 30, block_tokens=B, disk=DiskTier(tmp_path, 1 << 30))  # a restart
    found, n = again.lookup((*a[:12], 50))
    assert n == 12 and again.last.from_disk == 12
    expect(found, a[:12])
    assert again.lookup((*a[:12], 50))[1] == 12 and again.last.from_disk == 0  # back in memory


def test_stored_blocks_are_written_through_a_step_later_so_a_restart_finds_them(tmp_path: Path) -> None:
    s = BlockStore(max_bytes=1 << 30, block_tokens=B, disk=DiskTier(tmp_path, 1 << 30))
    a = list(range(1, 10))
    store(s, a)
    s.fit(1 << 30)  # the next step: nothing is evicted, the full blocks go to disk all the same
    s.close()
    assert len(list(tmp_path.glob("*.safetensors"))) == 2
    again = BlockStore(max_bytes=1 << 30, block_tokens=B, disk=DiskTier(tmp_path, 1 << 30))
    found, n = again.lookup(tuple(a))
    assert n == 8 and again.last.from_disk == 8
    expect(found, a[:8])


def test_without_write_through_blocks_reach_disk_when_evicted_or_at_a_clean_stop(tmp_path: Path) -> None:
    """Where the host cannot read the accelerator's memory in place (a CUDA GPU), blocks in use are
    not written as they are stored; a restart after a clean stop finds them all the same."""
    s = BlockStore(max_bytes=1 << 30, block_tokens=B, disk=DiskTier(tmp_path, 1 << 30), write_through=False)
    a, b = list(range(1, 10)), list(range(100, 109))
    store(s, a)
    store(s, b)
    s.fit(1 << 30)  # steps go by: nothing is written
    s.lookup((*a, 60))
    assert s.disk is not None
    settle(s.disk)
    assert list(tmp_path.glob("*.safetensors")) == []
    s.fit(3 * block_bytes())  # pressure: b's blocks (the least recent) spill, a's stay in memory
    settle(s.disk)
    assert len(list(tmp_path.glob("*.safetensors"))) == 2
    s.close()  # a clean stop writes what memory still holds
    assert len(list(tmp_path.glob("*.safetensors"))) == 4
    again = BlockStore(max_bytes=1 << 30, block_tokens=B, disk=DiskTier(tmp_path, 1 << 30))
    for tokens in (a, b):
        found, n = again.lookup(tuple(tokens))
        assert n == 8 and again.last.from_disk == 8
        expect(found, tokens[:8])


def test_the_disk_tier_keeps_to_its_cap_oldest_first(tmp_path: Path) -> None:
    tier = DiskTier(tmp_path, 1 << 30)
    s = BlockStore(max_bytes=1 << 30, block_tokens=B, disk=tier)
    store(s, list(range(1, 9)))
    s.fit(0)
    settle(tier)
    first = sorted(tmp_path.glob("*.safetensors"), key=lambda p: p.stat().st_mtime_ns)
    tier.max_bytes = 2 * first[0].stat().st_size + 100  # two files
    s.fit(1 << 30)
    store(s, list(range(20, 28)))
    s.fit(0)
    settle(tier)
    assert len(tier) == 2 and tier.nbytes <= tier.max_bytes
    assert not any(p.exists() for p in first)  # the older chain's files went first


@pytest.mark.parametrize("damage", ["truncated", "garbage", "foreign"])
def test_a_damaged_or_foreign_file_is_removed_and_never_served(tmp_path: Path, damage: str) -> None:
    tier = DiskTier(tmp_path, 1 << 30)
    s = BlockStore(max_bytes=1 << 30, block_tokens=B, disk=tier)
    a = [1, 2, 3, 4, 5]
    store(s, a)
    s.fit(0)
    settle(tier)
    tier.close()
    (path,) = tmp_path.glob("*.safetensors")
    if damage == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) - 40])
    elif damage == "garbage":
        path.write_bytes(os.urandom(300))
    else:  # another block's file under this block's name
        other = DiskTier(tmp_path / "other", 1 << 30)
        o = BlockStore(max_bytes=1 << 30, block_tokens=B, disk=other)
        store(o, [7, 7, 7, 7, 7])
        o.fit(0)
        settle(other)
        other.close()
        (foreign,) = (tmp_path / "other").glob("*.safetensors")
        os.replace(foreign, path)
    again = BlockStore(max_bytes=1 << 30, block_tokens=B, disk=DiskTier(tmp_path, 1 << 30))
    assert again.lookup(tuple(a)) == (None, 0)
    assert not path.exists()


def test_a_full_disk_turns_the_tier_off_with_one_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_space(path: str, arrays: Any, metadata: Any = None) -> None:
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(mx, "save_safetensors", no_space)
    tier = DiskTier(tmp_path, 1 << 30)
    s = BlockStore(max_bytes=1 << 30, block_tokens=B, disk=tier)
    for i in range(3):
        store(s, [i * 10 + t for t in range(1, 9)])
        s.fit(0)
        settle(tier)
    assert not tier.enabled
    assert [r for r in caplog.records if "full" in r.getMessage()].__len__() == 1
    assert list(tmp_path.iterdir()) == []  # no partial file left behind
    s.fit(1 << 30)
    store(s, [1, 2, 3, 4, 5])  # serving goes on from memory
    assert s.lookup((1, 2, 3, 4, 5, 6))[1] == 5


def llama(seed: int, layers: int = 2) -> Any:
    from mlx_lm.models import llama as arch

    mx.random.seed(seed)
    args = arch.ModelArgs(
        model_type="llama",
        hidden_size=32,
        num_hidden_layers=layers,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=128,
    )
    return arch.Model(args)


def test_blocks_are_kept_per_model_fingerprint_weights_dtype_and_layout() -> None:
    a, same = llama(0), llama(0)
    assert fingerprint(a, B) == fingerprint(same, B)
    assert fingerprint(a, B) != fingerprint(llama(1), B)  # other weights
    assert fingerprint(a, B) != fingerprint(llama(0, layers=3), B)  # another KV layout
    assert fingerprint(a, B) != fingerprint(a, 2 * B)  # another block size
    same.set_dtype(mx.bfloat16)
    assert fingerprint(a, B) != fingerprint(same, B)


def test_a_fine_tune_that_differs_only_past_the_first_values_has_its_own_blocks() -> None:
    """Two models (a fine-tune, a merged adapter) whose every tensor starts alike but differs
    further in never share blocks on disk."""
    a, tuned = llama(0), llama(0)
    w = tuned.model.layers[0].mlp.down_proj.weight
    tuned.model.layers[0].mlp.down_proj.weight = mx.concatenate([w[:-1], w[-1:] + 0.5])
    assert fingerprint(a, B) != fingerprint(tuned, B)
