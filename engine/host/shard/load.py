"""This rank's shard of the model: loaded lazily, split with mlx-lm, then evaluated.

Only the shard is ever materialized (for a quantized model on a CPU, `--dequantize auto` may
first make a float32 copy of the whole: it does so only when that fits a quarter of RAM).
"""

from __future__ import annotations

from typing import Any

from mlx_serve.engine.host.shard import ShardMode, ShardRefused
from mlx_serve.engine.model.loader import LoadedModel, ModelSpec

# mlx-lm 0.32: the model families whose text model has `pipeline()` (models/pipeline.py users).
PIPELINE_HINT = "qwen2, qwen3_moe, qwen3_5, deepseek_v2/v3, glm4_moe, ministral3, mistral4"


def check_shardable(model: Any, mode: ShardMode, size: int, model_id: str) -> None:
    """Refuse, naming the reason, a model mlx-lm cannot split `size` ways in `mode`."""
    if mode is ShardMode.PIPELINE:
        inner = getattr(model, "model", None)
        if not hasattr(inner, "pipeline"):
            raise ShardRefused(
                f"{model_id} ({getattr(model, 'model_type', '?')}) has no pipeline sharding in mlx-lm; "
                f"families that have it: {PIPELINE_HINT}. Try --shard tensor."
            )
        layers = len(getattr(inner, "layers", ()))
        if layers < size:
            raise ShardRefused(f"{model_id} has {layers} layers: too few for a {size}-stage pipeline")
        return
    if not hasattr(model, "shard"):
        raise ShardRefused(f"{model_id} has no tensor sharding in mlx-lm; try --shard pipeline")
    counts = _split_counts(model)
    bad = {name: n for name, n in counts.items() if n % size}
    if bad:
        shown = ", ".join(f"{name} {n}" for name, n in counts.items())
        raise ShardRefused(
            f"--shard tensor over {size} ranks needs every split dimension to divide by {size}; "
            f"{model_id} has {shown}. Use another rank count, --shard pipeline, or another model."
        )


def _split_counts(model: Any) -> dict[str, int]:
    """What tensor sharding divides: the attention heads, the KV heads and the FFN width."""
    args = getattr(model, "args", None)
    text = getattr(args, "text_config", None)
    source = text if isinstance(text, dict) else vars(args) if args is not None else {}
    heads = source.get("num_attention_heads") or source.get("n_heads")
    counts = {
        "attention heads": heads,
        "KV heads": source.get("num_key_value_heads") or heads,
        "FFN width": source.get("intermediate_size"),
    }
    return {k: int(v) for k, v in counts.items() if isinstance(v, int) and v > 0}


def shard_in_place(model: Any, mode: ShardMode, group: Any) -> None:
    if mode is ShardMode.TENSOR:
        model.shard(group)
    else:
        model.model.pipeline(group)


def load_shard(spec: ModelSpec, mode: ShardMode, group: Any) -> LoadedModel:
    """This rank's part of the weights, evaluated, and the tokenizer."""
    import mlx.core as mx
    from mlx_lm.utils import load as mlx_load

    from mlx_serve.engine.model.loader import maybe_dequantize

    if spec.adapter_path:
        raise ShardRefused("--adapter-path cannot be combined with --shard (LoRA layers are not sharded)")
    print(f"Loading {spec.model_id} from {spec.path} (rank {group.rank()} of {group.size()}) ...", flush=True)
    loaded = mlx_load(
        str(spec.path),
        tokenizer_config=spec.tokenizer_config(),
        lazy=True,
        trust_remote_code=spec.trust_remote_code,
    )
    model, tokenizer = loaded[0], loaded[1]
    check_shardable(model, mode, group.size(), spec.model_id)
    model = maybe_dequantize(model, spec.dequantize)  # before splitting: sharded layers stay quantized
    shard_in_place(model, mode, group)
    mx.eval(model.parameters())
    return LoadedModel(model=model, tokenizer=tokenizer, model_id=spec.model_id, path=spec.path)
