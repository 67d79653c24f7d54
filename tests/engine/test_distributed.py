"""Tier 1: sharded serving's pieces without a group: the step channel's framing, rank 0's runner
and a follower mirroring it, the shardability checks, the memory agreement's arithmetic, the
liveness watch and the process host's no-restart rule. Two real ranks: tests/e2e."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from mlx_serve.engine.host.shard import GROUP_LOST_EXIT, ShardMode, ShardRefused, group_lost_message
from mlx_serve.engine.host.shard.channel import HEADER_BYTES, Admit, Channel, Message, Reset, Step, checksum
from mlx_serve.engine.host.shard.follower import Diverged, Follower
from mlx_serve.engine.host.shard.leader import LeaderRunner
from mlx_serve.engine.rows.step_records import PrefillChunk, StepOutput, StepPlan
from mlx_serve.engine.types import Request


@dataclass(slots=True)
class RecordingRunner:
    """Records what it is asked to do; each step emits `token` for every admitted row."""

    token: int = 7
    calls: list[tuple[str, Any]] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)

    def admit(self, request: Request, cache: Any = None, num_cached: int = 0, constraint: Any = None) -> None:
        self.calls.append(("admit", (request.id, num_cached)))
        self.rows.append(request.id)

    def step(self, plan: StepPlan) -> StepOutput:
        self.calls.append(("step", plan))
        return StepOutput({r: self.token for r in self.rows})

    def reset(self) -> None:
        self.calls.append(("reset", None))
        self.rows.clear()


@dataclass(slots=True)
class ListChannel:
    """Rank 0's end of the channel, kept in memory; `broken` makes the next publish fail like a ring."""

    sent: list[Message] = field(default_factory=list)
    broken: bool = False

    def publish(self, message: Message) -> None:
        if self.broken:
            raise RuntimeError("[ring] connection to a peer was lost")
        self.sent.append(message)


def _plan(seq: str, start: int = 0, end: int = 3) -> StepPlan:
    return StepPlan((PrefillChunk(seq, start, end, True),), admitted=(seq,))


def _leader(channel: ListChannel, lost: list[str] | None = None) -> tuple[LeaderRunner, RecordingRunner]:
    inner = RecordingRunner()
    on_lost = lost.append if lost is not None else lambda _r: None
    return LeaderRunner(inner, channel, on_lost), inner  # type: ignore[arg-type]


def test_channel_frames_short_and_long_messages_alike() -> None:
    import mlx.core as mx

    channel = Channel(mx.distributed.init())  # a group of one: all_sum hands back what was sent
    for size in (0, 10, HEADER_BYTES - 8, HEADER_BYTES - 7, 3 * HEADER_BYTES + 5):
        data = bytes(i % 251 for i in range(size))
        assert channel._broadcast(data) == data


def test_leader_publishes_each_step_with_its_admits_before_running_it() -> None:
    channel = ListChannel()
    leader, inner = _leader(channel)
    request = Request("a", (1, 2, 3), max_tokens=4)
    leader.admit(request, None, 0)
    out = leader.step(_plan("a"))
    assert channel.sent == [Step((Admit(request, 0),), _plan("a"), None)]
    assert inner.calls[0] == ("admit", ("a", 0)) and inner.calls[1][0] == "step"
    leader.step(StepPlan(decode=("a",)))
    second = channel.sent[1]
    assert isinstance(second, Step) and second.admits == () and second.checksum == checksum(out)


def test_follower_mirrors_rank_0_and_checks_its_tokens() -> None:
    channel = ListChannel()
    leader, _ = _leader(channel)
    follower_runner = RecordingRunner()
    follower = Follower(follower_runner, None, None)  # type: ignore[arg-type]
    leader.admit(Request("a", (1, 2, 3)), None, 0)
    leader.step(_plan("a"))
    leader.step(StepPlan(decode=("a",)))
    leader.reset()
    for message in channel.sent:
        follower.handle(message)
    assert [c[0] for c in follower_runner.calls] == ["admit", "step", "step", "reset"]
    assert isinstance(channel.sent[-1], Reset)


def test_follower_that_sampled_other_tokens_leaves_the_group() -> None:
    channel = ListChannel()
    leader, _ = _leader(channel)
    follower = Follower(RecordingRunner(token=8), None, None)  # type: ignore[arg-type]
    leader.admit(Request("a", (1, 2, 3)), None, 0)
    leader.step(_plan("a"))
    leader.step(StepPlan(decode=("a",)))
    follower.handle(channel.sent[0])
    with pytest.raises(Diverged, match="other tokens"):
        follower.handle(channel.sent[1])


def test_follower_whose_prefix_cache_disagrees_leaves_the_group() -> None:
    class EmptyPrefixes:
        def lookup(self, tokens: tuple[int, ...]) -> tuple[list[Any] | None, int]:
            return None, 0

    follower = Follower(RecordingRunner(), EmptyPrefixes(), None)  # type: ignore[arg-type]
    step = Step((Admit(Request("a", (1, 2, 3, 4)), 2),), _plan("a", 2, 4), None)
    with pytest.raises(Diverged, match="holds 0 of its prompt tokens, rank 0's 2"):
        follower.handle(step)


def test_leader_reports_a_lost_rank_the_ring_noticed() -> None:
    channel, lost = ListChannel(broken=True), []
    leader, _ = _leader(channel, lost)
    with pytest.raises(RuntimeError):
        leader.step(_plan("a"))
    assert lost == ["[ring] connection to a peer was lost"]


def test_watch_sees_a_peer_process_end() -> None:
    from mlx_serve.engine.host.shard import watch

    server = watch.listen("127.0.0.1")
    port = server.getsockname()[1]
    follower = threading.Thread(target=lambda: conns.append(watch.connect_leader("127.0.0.1", port, 1)))
    conns: list[Any] = []
    follower.start()
    peers = watch.accept_followers(server, 1)
    follower.join(5)
    lost: list[str] = []
    done = threading.Event()
    watch.watch(peers, lambda why: (lost.append(why), done.set()))
    assert not done.wait(0.2)  # a live peer sends nothing and is left alone
    conns[0].close()  # what the kernel does when the follower's process dies
    assert done.wait(5) and lost == ["rank 1's connection closed"]


def _llama(heads: int, kv_heads: int) -> Any:
    from mlx_lm.models import llama

    args = {
        "model_type": "llama",
        "hidden_size": 8 * heads,
        "num_hidden_layers": 2,
        "intermediate_size": 36,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": 1e-5,
        "vocab_size": 32,
        "tie_word_embeddings": True,
    }
    return llama.Model(llama.ModelArgs.from_dict(args))


def test_check_shardable_refuses_by_name_what_mlx_lm_cannot_split() -> None:
    from mlx_serve.engine.host.shard.load import check_shardable

    smollm_like = _llama(9, 3)  # SmolLM2-135M: 9 heads, 3 KV heads
    with pytest.raises(ShardRefused, match="attention heads 9, KV heads 3"):
        check_shardable(smollm_like, ShardMode.TENSOR, 2, "SmolLM2")
    check_shardable(smollm_like, ShardMode.TENSOR, 3, "SmolLM2")
    with pytest.raises(ShardRefused, match="no pipeline sharding"):  # mlx-lm's llama has no pipeline()
        check_shardable(smollm_like, ShardMode.PIPELINE, 2, "SmolLM2")


def test_check_shardable_accepts_qwen2_both_ways() -> None:
    from mlx_lm.models import qwen2

    from mlx_serve.engine.host.shard.load import check_shardable

    args = {
        "model_type": "qwen2",
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": 32,
    }
    model = qwen2.Model(qwen2.ModelArgs.from_dict(args))
    check_shardable(model, ShardMode.TENSOR, 2, "q")
    check_shardable(model, ShardMode.PIPELINE, 2, "q")
    with pytest.raises(ShardRefused, match="too few"):
        check_shardable(model, ShardMode.PIPELINE, 3, "q")


def test_prefix_cache_cap_scales_with_this_ranks_kv_so_ranks_evict_alike() -> None:
    from mlx_serve.engine.host.shard.group import MemoryAgreement

    agreement = MemoryAgreement(group=None, kv_leader=3000, kv_self=5000)  # 3 layers here, 5 there
    cap = agreement.prefix_bytes(1 << 30)
    assert cap % 5000 == 0 and cap // 5000 == (1 << 30) // 3000
    assert MemoryAgreement(group=None).prefix_bytes(123) == 123


def test_group_lost_message_names_the_cause() -> None:
    assert "a rank left the group" in group_lost_message(GROUP_LOST_EXIT, "tensor", 2)
    assert "exit code -9" in group_lost_message(-9, "pipeline", 2)
    assert "while the group was forming" in group_lost_message(1, "", 0)


def test_sharded_engine_process_that_dies_is_not_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    import mlx_serve.engine.host.shard
    from mlx_serve.engine.host.child import ChildProcess
    from mlx_serve.engine.host.client import EngineState
    from mlx_serve.engine.host.outbox import Outbox
    from mlx_serve.engine.host.process import ProcessEngine

    monkeypatch.setattr(mlx_serve.engine.host.shard, "GROUP_LOST_GRACE_S", 0.0)

    async def scenario() -> tuple[ProcessEngine, list[str]]:
        engine_ = ProcessEngine(lambda: (None, ()), restartable=False)
        engine_._loop = asyncio.get_running_loop()
        engine_._child = child = ChildProcess(process=None, conn=None, outbox=Outbox(None))
        engine_.info = {"shard": {"mode": "tensor", "size": 2}}
        fatal: list[str] = []
        engine_.on_fatal = fatal.append
        engine_._spawn = lambda: pytest.fail("a sharded engine must not respawn")  # type: ignore[method-assign]
        engine_._on_death(child, GROUP_LOST_EXIT)
        await asyncio.sleep(0.05)
        return engine_, fatal

    engine_, fatal = asyncio.run(scenario())
    assert engine_.state is EngineState.FAILED and engine_.restarts == 0
    assert engine_.error is not None and "a rank left the group" in engine_.error
    assert fatal == [engine_.error]  # after the grace, the server exits for its service manager
