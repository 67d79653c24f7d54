"""Measuring a loaded model for the memory plan: the bytes of its weights, the KV bytes of one
sequence by how they grow (KvCost), and the sizes the transient estimate needs (ModelShape).

Apart from engine.batch.admission, which decides from these numbers what fits (see its NOTE): this
is the part that reads the model. MLX is imported inside the measuring functions only, so
admission stays importable on the server side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # MLX itself is imported where it is measured (see the module docstring)
    import mlx.core as mx

    from mlx_serve.engine.model.mlx_boundary import Model

KV_ALLOC_STEP = 256  # mlx_lm.models.cache.KVCache.step
PROBE_TOKENS = 4
MAX_CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "context_length",
    "n_ctx",
)


@dataclass(frozen=True, slots=True)
class KvCost:
    """KV bytes of one sequence, split by how they grow (see engine.batch.admission's NOTE)."""

    per_token: int = 0
    window_per_token: int = 0
    window_full: int = 0
    per_sequence: int = 0

    def __add__(self, other: KvCost) -> KvCost:
        return KvCost(
            self.per_token + other.per_token,
            self.window_per_token + other.window_per_token,
            self.window_full + other.window_full,
            self.per_sequence + other.per_sequence,
        )

    @property
    def step_slack(self) -> int:
        return (KV_ALLOC_STEP - 1) * (self.per_token + self.window_per_token)


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the transient estimate needs; vocab and activation dtype come from the probe."""

    hidden: int
    intermediate: int
    heads: int
    vocab: int
    act_bytes: int
    max_context: int | None


def weights_bytes(model: Model) -> int:
    """Bytes of every parameter as stored (quantized weights count their packed size)."""
    return sum(a.nbytes for a in _arrays(model.parameters()))


@dataclass(frozen=True, slots=True)
class Probe:
    kv: KvCost
    shape: ModelShape


def probe_model(model: Model) -> Probe:
    """A few tokens through a fresh cache: the caches' shapes and dtypes give the KV cost."""
    import mlx.core as mx

    from mlx_serve.engine.model.mlx_boundary import make_prompt_cache

    # Never evaluated: MLX knows the shapes and dtypes of the lazy graph, so the probe costs no
    # forward pass (and no memory) even for a large model on a CPU.
    cache = make_prompt_cache(model)
    logits = model(mx.arange(PROBE_TOKENS)[None], cache=cache)
    kv = sum((_layer_cost(c) for c in cache), KvCost())
    return Probe(kv, _shape(model, logits.shape[-1], logits.dtype.size))


def _layer_cost(c: Any) -> KvCost:  # a layer of any kind, read by what it has
    from mlx_serve.engine.model import mlx_boundary as mc

    if isinstance(c, mc.CacheList):
        return sum((_layer_cost(x) for x in c.caches), KvCost())
    if isinstance(c, mc.ArraysCache) or not hasattr(c, "keys"):
        return KvCost(per_sequence=sum(a.nbytes for a in _arrays(c.state)))
    per_token = _bytes_per_slot(c.keys) + _bytes_per_slot(c.values)
    if isinstance(c, mc.RotatingKVCache | mc.BatchRotatingKVCache):
        return KvCost(window_per_token=per_token, window_full=c.max_size * per_token)
    if isinstance(c, mc.ChunkedKVCache):
        return KvCost(window_per_token=per_token, window_full=(c.chunk_size + KV_ALLOC_STEP) * per_token)
    return KvCost(per_token=per_token)


def _bytes_per_slot(x: object) -> int:
    # Keys/values are (batch=1, heads, slots, dim), or a tuple of such for quantized caches;
    # dividing by the allocated slots skips the 256-slot preallocation.
    return sum(a.nbytes // a.shape[-2] for a in _arrays(x) if a.ndim >= 2)


def _arrays(tree: object) -> list[mx.array]:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    flat = cast("list[tuple[str, object]]", tree_flatten(tree, destination=[]))
    return [a for _, a in flat if isinstance(a, mx.array)]


def _shape(model: Model, vocab: int, act_bytes: int) -> ModelShape:
    hidden = _arg(model, "hidden_size", "d_model", "n_embd", "dim") or 8192
    inter = max(
        _arg(model, "intermediate_size", "ffn_dim", "n_inner", "hidden_dim") or 4 * hidden,
        (_arg(model, "moe_intermediate_size") or 0) * (_arg(model, "num_experts_per_tok") or 1),
    )
    heads = _arg(model, "num_attention_heads", "n_heads", "n_head", "num_heads") or 64
    return ModelShape(hidden, inter, heads, vocab, act_bytes, _arg(model, *MAX_CONTEXT_KEYS))


def _arg(model: Model, *names: str) -> int | None:
    """The first positive integer setting by these names in the model's args (or text_config)."""
    args = getattr(model, "args", None)
    text = getattr(args, "text_config", None)
    for source in (args, text):
        for name in names:
            value = source.get(name) if isinstance(source, dict) else getattr(source, name, None)
            if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
                value = max(value)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None
