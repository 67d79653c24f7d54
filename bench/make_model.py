"""Build a random-weight Llama model folder that mlx-lm (and mlx-serve) can load.

    python -m bench.make_model --shape tiny|layers16|1b|8b --out DIR [--tokenizer-from DIR|FILE.gguf|smollm2]
        [--dtype auto|float32|bfloat16|float16] [--seed 0] [--context 131072]
    python -m bench.make_model --tokenizer-only --out DIR [--tokenizer-from ...]

Shapes follow Llama-3.2-1B and Llama-3.1-8B (vocab 128256 kept for realistic compute even with a
smaller tokenizer). The lm_head rows of ids the tokenizer lacks, and of its special tokens, are
zeroed: random logits elsewhere are almost surely larger, so greedy decoding never emits an id the
tokenizer cannot decode and never stops early on EOS — what a decode benchmark wants.
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import mlx.core as mx

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
)
SHARD_BYTES = 4 * 1024**3


@dataclass(frozen=True, slots=True)
class LlamaShape:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    rope_theta: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


SHAPES: dict[str, LlamaShape] = {
    "tiny": LlamaShape(128, 4, 4, 2, 384, 49152, True, 100000.0),
    # The 1B's 16 layers at almost no arithmetic: a step costs what its Python and graph cost,
    # as a small model's step does on a GPU (a CPU proxy for per-token overhead).
    "layers16": LlamaShape(32, 16, 2, 1, 64, 49152, True, 100000.0),
    "1b": LlamaShape(2048, 16, 32, 8, 8192, 128256, True, 500000.0),
    "8b": LlamaShape(4096, 32, 32, 8, 14336, 128256, False, 500000.0),
}


def config_dict(
    shape: LlamaShape, dtype: str, special_ids: list[int], context: int = 131072
) -> dict[str, object]:
    """A Hugging Face style config.json for `shape`."""
    config: dict[str, object] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **asdict(shape),
        "head_dim": shape.head_dim,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": context,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype,
        "bench_random_weights": True,
    }
    if special_ids:
        config["eos_token_id"] = special_ids[0]
    return config


def tensor_shapes(shape: LlamaShape) -> dict[str, tuple[int, ...]]:
    """Every weight name mlx-lm's llama expects, with its shape."""
    h, hd = shape.hidden_size, shape.head_dim
    q, kv, ffn = shape.num_attention_heads * hd, shape.num_key_value_heads * hd, shape.intermediate_size
    names: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (shape.vocab_size, h)}
    for i in range(shape.num_hidden_layers):
        p = f"model.layers.{i}."
        names |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (ffn, h),
            p + "mlp.up_proj.weight": (ffn, h),
            p + "mlp.down_proj.weight": (h, ffn),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    names["model.norm.weight"] = (h,)
    if not shape.tie_word_embeddings:
        names["lm_head.weight"] = (shape.vocab_size, h)
    return names


def random_tensor(dims: tuple[int, ...], dtype: mx.Dtype, banned: list[int]) -> mx.array:
    """Norms are ones; matrices N(0, 0.02); `banned` rows (of the output projection) zeroed."""
    import mlx.core as mx

    if len(dims) == 1:
        return mx.ones(dims, dtype=dtype)
    w = (mx.random.normal(dims, dtype=mx.float32) * 0.02).astype(dtype)
    if banned:
        keep = mx.ones((dims[0], 1), dtype=dtype)
        keep[mx.array(banned)] = 0
        w = w * keep
    return w


def write_weights(shape: LlamaShape, out: Path, dtype_name: str, banned: list[int]) -> None:
    """Generate and save the weights shard by shard, with an index when there is more than one."""
    import mlx.core as mx

    dtype = getattr(mx, dtype_name)
    shards: list[dict[str, mx.array]] = [{}]
    size = 0
    output = "model.embed_tokens.weight" if shape.tie_word_embeddings else "lm_head.weight"
    for name, dims in tensor_shapes(shape).items():
        nbytes = dtype.size * _numel(dims)
        if size and size + nbytes > SHARD_BYTES:
            _save_shard(shards[-1], out, len(shards))
            shards.append({})
            size = 0
        shards[-1][name] = random_tensor(dims, dtype, banned if name == output else [])
        mx.eval(shards[-1][name])
        size += nbytes
    _save_shard(shards[-1], out, len(shards))
    _finish_shards(out, len(shards))


def _numel(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _save_shard(tensors: dict[str, mx.array], out: Path, number: int) -> None:
    import mlx.core as mx

    mx.save_safetensors(str(out / f"model-{number:05d}.safetensors"), tensors, metadata={"format": "mlx"})
    names = sorted(tensors)
    (out / f"model-{number:05d}.names.json").write_text(json.dumps(names))
    tensors.clear()


def _finish_shards(out: Path, count: int) -> None:
    """Rename shards to the HF `-of-` pattern and write model.safetensors.index.json."""
    weight_map: dict[str, str] = {}
    for number in range(1, count + 1):
        final = f"model-{number:05d}-of-{count:05d}.safetensors" if count > 1 else "model.safetensors"
        (out / f"model-{number:05d}.safetensors").rename(out / final)
        names_file = out / f"model-{number:05d}.names.json"
        weight_map |= {name: final for name in json.loads(names_file.read_text())}
        names_file.unlink()
    if count > 1:
        index = {"metadata": {}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))


def copy_tokenizer(source: str, out: Path) -> None:
    """Copy tokenizer files from a folder, or build them from a GGUF ('smollm2': the packaged one)."""
    from bench.gguf_tokenizer import packaged_smollm2_gguf, save_gguf_tokenizer

    if source == "smollm2" or source.endswith(".gguf"):
        gguf = packaged_smollm2_gguf() if source == "smollm2" else Path(source)
        save_gguf_tokenizer(gguf, out)
        return
    copied = [n for n in TOKENIZER_FILES if (Path(source) / n).exists()]
    if "tokenizer.json" not in copied and "tokenizer.model" not in copied:
        raise FileNotFoundError(f"{source}: no tokenizer.json or tokenizer.model")
    for name in copied:
        shutil.copy2(Path(source) / name, out / name)


def tokenizer_facts(out: Path) -> tuple[int, list[int]]:
    """(number of token ids, special token ids) of the tokenizer now in `out`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    specials = [tok.eos_token_id] if tok.eos_token_id is not None else []
    specials += [i for i in tok.all_special_ids if i not in specials]
    return len(tok), specials


def resolve_dtype(name: str) -> str:
    """'auto' is bfloat16 on a GPU and float32 (MLX's fastest CPU dtype) otherwise."""
    if name != "auto":
        return name
    import mlx.core as mx

    return "bfloat16" if mx.default_device() == mx.gpu else "float32"


def make_model(
    shape_name: str, out: Path, tokenizer_from: str, dtype: str, seed: int, context: int = 131072
) -> Path:
    """Write config.json, tokenizer files and random weights into `out`; return `out`."""
    import mlx.core as mx

    out.mkdir(parents=True, exist_ok=True)
    copy_tokenizer(tokenizer_from, out)
    n_tokens, specials = tokenizer_facts(out)
    shape = SHAPES[shape_name]
    if shape_name in ("tiny", "layers16"):
        shape = LlamaShape(**{**asdict(shape), "vocab_size": n_tokens})
    banned = specials + list(range(n_tokens, shape.vocab_size))
    dtype = resolve_dtype(dtype)
    mx.random.seed(seed)
    (out / "config.json").write_text(json.dumps(config_dict(shape, dtype, specials, context), indent=1))
    write_weights(shape, out, dtype, banned)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", choices=sorted(SHAPES))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokenizer-from", default="smollm2", help="folder, .gguf file, or 'smollm2'")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context", type=int, default=131072, help="max_position_embeddings")
    parser.add_argument("--tokenizer-only", action="store_true", help="write only the tokenizer files")
    args = parser.parse_args(argv)
    if args.tokenizer_only:
        args.out.mkdir(parents=True, exist_ok=True)
        copy_tokenizer(args.tokenizer_from, args.out)
        print(f"wrote tokenizer files to {args.out}")
        return
    if args.shape is None:
        parser.error("--shape is required (or --tokenizer-only)")
    out = make_model(args.shape, args.out, args.tokenizer_from, args.dtype, args.seed, args.context)
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    print(f"wrote {out} ({args.shape}, {size / 1e9:.2f} GB of weights)")


if __name__ == "__main__":
    main()
