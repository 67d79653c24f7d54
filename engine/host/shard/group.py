"""Joining the distributed group, the start handshake, and the memory every rank agrees on."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mlx_serve.engine.batch.admission import MemoryPlan
from mlx_serve.engine.host.shard import ShardRefused

log = logging.getLogger("mlx_serve.shard")

JOIN_TIMEOUT_S = 600.0  # how long a rank waits for the others to come up


def launch_rank() -> int | None:
    """This process's rank as mlx.launch set it (ring, JACCL, NCCL), or None outside mlx.launch."""
    rank = os.environ.get("MLX_RANK")
    return int(rank) if rank is not None and rank.isdigit() else None


def backend_from_env() -> str:
    """The backend mlx.launch prepared (each leaves its own variable); "any" otherwise."""
    if os.environ.get("MLX_HOSTFILE"):
        return "ring"
    if os.environ.get("MLX_JACCL_COORDINATOR"):
        return "jaccl"
    if os.environ.get("NCCL_HOST_IP"):
        return "nccl"
    return "any"


def leader_address() -> str:
    """Where the other ranks reach rank 0, from what mlx.launch prepared for the backend."""
    hostfile = os.environ.get("MLX_HOSTFILE")
    if hostfile and Path(hostfile).is_file():
        hosts = json.loads(Path(hostfile).read_text())  # ring: [["ip:port", ...], ...] by rank
        if isinstance(hosts, list) and hosts and hosts[0]:
            return str(hosts[0][0]).rsplit(":", 1)[0]
    coordinator = os.environ.get("MLX_JACCL_COORDINATOR")
    if coordinator:
        return coordinator.rsplit(":", 1)[0]
    return os.environ.get("NCCL_HOST_IP") or "127.0.0.1"


def join_group(timeout_s: float = JOIN_TIMEOUT_S) -> Any:
    """The world group, once every rank is up. A ring rank gives up connecting after about 30
    seconds and rank 0 waits in accept() for good, so each attempt runs on a thread and is
    retried until `timeout_s`."""
    rank = launch_rank()
    if rank is None:
        raise ShardRefused("--shard needs every rank started by mlx.launch (MLX_RANK is not set)")
    backend, deadline = backend_from_env(), time.monotonic() + timeout_s
    while True:
        result: list[Any] = []
        attempt = threading.Thread(target=_init, args=(backend, result), name="shard-join", daemon=True)
        attempt.start()
        attempt.join(max(deadline - time.monotonic(), 0.0))
        if result and not isinstance(result[0], Exception):
            return _at_least_two(result[0])
        if time.monotonic() >= deadline:
            why = f": {result[0]}" if result else ""
            raise ShardRefused(f"rank {rank} could not join the {backend} group in {timeout_s:.0f} s{why}")
        log.warning("rank %s: the group is not up yet (%s); retrying", rank, result[0])


def _init(backend: str, result: list[Any]) -> None:
    import mlx.core as mx

    try:
        result.append(mx.distributed.init(strict=True, backend=backend))
    except RuntimeError as exc:
        result.append(exc)


def _at_least_two(group: Any) -> Any:
    if group.size() < 2:
        raise ShardRefused("the group has one rank: start it with mlx.launch -n 2 or a hostfile")
    return group


def gather_ints(group: Any, values: list[int]) -> list[list[int]]:
    """Every rank's `values`, by rank (one all_gather on the CPU communication stream)."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    with mx.stream(generation_stream):
        out = mx.distributed.all_gather(mx.array([values], dtype=mx.int64), group=group)
        mx.eval(out)
    rows: list[list[int]] = out.tolist()  # type: ignore[assignment]
    return rows


def fingerprint(settings: Any, model_path: Path) -> int:
    """What must be the same on every rank: the engine settings and the model's config."""
    config = (model_path / "config.json").read_bytes() if (model_path / "config.json").exists() else b""
    return zlib.crc32(repr(replace(settings, seed=None)).encode() + config)


def handshake(group: Any, settings: Any, model_path: Path, watch_port: int) -> tuple[int, int]:
    """Check that every rank runs the same settings and model; rank 0's random seed (which every
    rank uses) and the port of its liveness listener (engine.host.shard.watch)."""
    mine = settings.seed if settings.seed is not None else int.from_bytes(os.urandom(4), "little") >> 1
    rows = gather_ints(group, [fingerprint(settings, model_path), mine, watch_port])
    odd = [rank for rank, row in enumerate(rows) if row[0] != rows[0][0]]
    if odd:
        raise ShardRefused(
            f"ranks {odd} run other settings or another model than rank 0: start every rank with the "
            "same flags and the same model"
        )
    return rows[0][1], rows[0][2]


@dataclass(slots=True)
class MemoryAgreement:
    """make_core's shard hooks: the group's memory plan (the least of the ranks'), and this rank's
    prefix-cache byte cap in proportion to its KV per token, so every rank evicts alike."""

    group: Any
    kv_leader: int = 0  # rank 0's KV bytes per token (known after agree)
    kv_self: int = 0

    def agree(self, plan: MemoryPlan) -> MemoryPlan:
        per_token = plan.kv.per_token + plan.kv.window_per_token
        mine = [plan.kv_capacity_tokens, plan.context_limit, per_token, plan.max_running]
        rows = gather_ints(self.group, mine)
        self.kv_leader, self.kv_self = rows[0][2], per_token
        least = replace(
            plan,
            kv_capacity_tokens=min(r[0] for r in rows),
            context_limit=min(r[1] for r in rows),
            max_running=min(r[3] for r in rows),  # every rank's batch holds the same rows
        )
        print(
            f"  sharded over {len(rows)} ranks: rank {self.group.rank()} holds weights "
            f"{plan.weights_bytes / 2**20:.0f} MiB, KV {per_token} B/token; the group serves the least "
            f"of the ranks' plans: {least.kv_capacity_tokens:,} KV tokens, context {least.context_limit:,}",
            flush=True,
        )
        return least

    def prefix_bytes(self, nbytes: int) -> int:
        if not self.kv_leader or not self.kv_self:
            return nbytes
        return (nbytes // self.kv_leader) * self.kv_self
