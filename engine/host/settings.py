"""The engine's settings: EngineSettings (its knobs) and ModelSource (which model to serve and
how to load it).

What the server's flags become (server.cli) and what engine.host.build puts an engine together
from; picklable, so the engine process and each rank of a sharded group rebuild the same engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlx_serve.engine.model.loader import ModelSpec

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # the server's and the engine's


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """The engine's knobs, picklable so a child process can rebuild the same engine."""

    max_running: int | None = None  # rows decoded together; None: what the memory plan fits (≤256)
    max_prefilling: int = 8
    token_budget: int = 2048
    max_step_s: float | None = None  # a step's time target beside decoding rows (engine.batch.step_cost)
    max_waiting: int = 64
    prompt_cache_size: int = 10
    prompt_cache_bytes: int | None = None  # None: the KV memory running rows leave free
    prompt_cache_dir: str | None = None  # the disk tier's folder; None: engine.batch.disk_tier.default_dir()
    prompt_cache_disk_bytes: int = 16 << 30  # the disk tier's cap; 0: no disk tier
    seed: int | None = None
    memory_budget_bytes: int | None = None
    max_context: int | None = None
    draft_kind: str | None = None  # speculative decoding: "ngram", "draft" (a draft model) or None
    num_draft_tokens: int = 3
    speculation_gated: bool = (
        True  # speculate only where it measures faster; False: whenever rows have drafts
    )
    draft_spec: ModelSpec | None = None
    tool_call_parser: str | None = None  # a tool_formats family name; None: inferred
    shard: str | None = None  # "tensor" or "pipeline": one model over an mlx.launch group (engine.host.shard)
    warmup: bool = True  # compile the usual kernel shapes: some before ready, the rest while idle (GPU)
    stall_s: float = 30.0  # watchdog: no step this long with work in flight (0: off)
    restart_stalled: bool = True  # then kill and restart the engine process (False: wait for it)
    kv_bits: int | None = None  # rows' KV stored quantized at this many bits (engine.rows.quantized_kv)
    kv_group_size: int = 64

    @property
    def capacity(self) -> int:
        """Calls that may be in flight at once: running rows plus the waiting queue (until the
        engine reports its memory plan, whose rows then size the Gate: `Gate.size`)."""
        from mlx_serve.engine.batch.admission import MAX_ROWS_FROM_MEMORY

        return (self.max_running or MAX_ROWS_FROM_MEMORY) + self.max_waiting


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Which model to serve and how to load it (the server's --model and its neighbours)."""

    model: str | None = None  # a folder, a .gguf, a Hub id, a shortcut name; None: the default
    adapter_path: str | None = None
    chat_template: str = ""
    trust_remote_code: bool = False
    dequantize: str = "auto"
    draft_model: str | None = None
    host: str = "process"  # "process": a restartable child process; "thread": in this process

    def model_spec(self) -> ModelSpec:
        from mlx_serve.engine.model.loader import prepare

        return prepare(
            self.model,
            adapter_path=self.adapter_path,
            chat_template=self.chat_template,
            trust_remote_code=self.trust_remote_code,
            dequantize=self.dequantize,
        )

    def draft_spec(self) -> ModelSpec | None:
        from mlx_serve.engine.model.loader import prepare

        if not self.draft_model:
            return None
        return prepare(self.draft_model, trust_remote_code=self.trust_remote_code, dequantize=self.dequantize)
