"""Sharded serving: one model over several machines with MLX's distributed layer, batching kept.

    mlx.launch --backend ring --hostfile hosts.json -- mlx-serve --model M --shard tensor|pipeline

NOTE, the design. Every rank runs the same `mlx-serve` command; mlx.launch tells them apart with
MLX_RANK. Rank 0 serves HTTP and owns the only scheduler; ranks ≠ 0 (followers) serve nothing.
Every rank holds its shard of the weights and KV (tensor: 1/N of each layer's heads and FFN
through mlx-lm's `model.shard(group)`; pipeline: 1/N of the layers through
`model.model.pipeline(group)`) and the same runner, prefix cache and samplers, built by the same
`engine.host.assemble.make_core`. Modules: `load` (the shard), `group` (joining, the start handshake,
the memory agreement), `watch` (liveness), `channel` (the step messages), `rank` (the start
every rank makes), `leader` (rank 0), `follower` (the rest).

The step. Rank 0's core runs `plan = scheduler.schedule()` as ever; its runner is a
`LeaderRunner`, which publishes a `Step` before running it: the requests admitted this step
(whole: prompt tokens, sampling, grammar) with their cached-prefix length, the StepPlan, and a
checksum of the previous step's tokens. Each follower admits the same rows (its own prefix-cache
lookup must find the same prefix), runs the same `runner.step(plan)` and checks the checksum.
Continuous batching, chunked prefill, joins and leaves follow from running the same plans. A
message is pickled and broadcast by `all_sum` (followers add zeros): a 4 KiB header holds its
length and, mostly, all of it; a longer one takes a second all_sum. Messages go on the stream
the model's own collectives use, so every rank runs all collectives in the order it issued them
(the ring matches them by order alone).

Sampling happens on every rank; no token is broadcast back. All ranks compute the same logits
bit for bit (tensor: all_sum gives every rank the same sums; pipeline: the last stage's hidden
state is all_gathered), the random seed is rank 0's (shared at start), seeded rows carry their
own keys, and each rank draws in the same order. Broadcasting tokens instead would cost a
collective a step and a change inside mlx-lm's batch, which feeds its own samples back. The
checksum turns any disagreement into a group failure instead of silently different KV.

Speculation: --draft-model / --draft-kind are refused with --shard (the speculation gate
decides from wall-clock timings, which differ per rank). A request's own prediction (Predicted
Outputs) still speculates, ungated, so the decision is the same everywhere.

Admission: each rank plans its own memory (the weights it holds, its KV per token); at start the
ranks all_gather (KV capacity, context limit) and all use the least, so rank 0's gate and
scheduler never admit what another rank cannot hold. Each rank's prefix-cache byte cap is
scaled by its share of the KV per token, so every rank evicts the same entries.

Liveness: MLX's collectives do not report a lost peer dependably (a ring graph of a few
collectives hangs the survivor; JACCL never notices), so each follower holds a plain TCP
connection to rank 0 that carries nothing; the kernel ends it when a process dies (keepalive,
when a machine vanishes). When any ends, the rank that sees it exits with GROUP_LOST_EXIT, stuck
collective or not (`watch`). On rank 0 that is the engine process: the server marks the engine
failed without restarting it (one rank cannot rejoin a group), /health answers 503 with the
reason for GROUP_LOST_GRACE_S, then the server exits 1. So the group restarts whole: mlx.launch
stops every rank as soon as one exits non-zero (a service manager restarts mlx.launch), and
ranks started as one service per machine are each restarted by theirs and meet again (a rank
waits up to ten minutes for the others).

Exactness: pipeline sharding computes each layer as one process does, so greedy output equals
single-process output bit for bit. Tensor sharding splits the dot products of o_proj and
down_proj into N partial sums that all_sum adds: logits differ from one process's in the last
bits (about 2e-6 on a random float32 model), so greedy tokens match unless two logits are that
close.

Not handled: a rank that hangs instead of dying (its connection stays up); a fault on
one rank only, mid-step (collectives mismatch; the checksum catches it a step later at best);
MPI (rank 0's engine runs in a child process, which cannot join an MPI world); LoRA adapters.
"""

from __future__ import annotations

import enum

# os.EX_UNAVAILABLE: the process that notices a lost rank exits with it (rank 0's engine, followers).
GROUP_LOST_EXIT = 69
# After its engine saw the group break, rank 0's server answers /health 503 with the reason for
# this long, then exits non-zero so that a service manager restarts it (and the group re-forms).
GROUP_LOST_GRACE_S = 10.0


class ShardMode(enum.Enum):
    TENSOR = "tensor"
    PIPELINE = "pipeline"


class ShardRefused(Exception):
    """The model, the flags or the group cannot be sharded as asked (a restart cannot fix it)."""


def group_lost_message(exitcode: int | None, mode: str, size: int) -> str:
    """What /health says once rank 0's engine process of a `size`-rank group (0: the group was
    still forming) has ended."""
    if exitcode == GROUP_LOST_EXIT:
        cause = "a rank left the group (its connection was lost)"
    else:
        cause = f"rank 0's engine process died (exit code {exitcode})"
    group = f"{mode}, {size} ranks" if size else "while the group was forming"
    return (
        f"sharded engine ({group}) is down: {cause}; a sharded group restarts only whole (restart every rank)"
    )
