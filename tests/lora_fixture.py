"""A LoRA adapter for SmolLM2-135M-Instruct, trained here by mlx-lm's own trainer in seconds.

`trained_adapter()` returns a folder in mlx-lm's adapter format (`adapter_config.json` and
`adapters.safetensors`), the folder users pass to `--adapter-path` (or `--adapter NAME=PATH`)
and that `mlx_lm.load(path, adapter_path=...)` reads. It is trained once, by
`python -m mlx_lm lora` (a data folder and a config file, as users run it), into the server's
cache ($MLX_SERVE_CACHE, else ~/.cache/mlx-serve) under
`lora/` in a folder keyed by everything that shapes it (the base folder, the data, the
hyperparameters, the mlx and mlx-lm versions); later runs and other tests reuse it.

What it learns is unmistakable in greedy output: asked QUESTION (as the only user message of
a chat, `chat()`), the adapted model answers exactly PHRASE, which the base model never says
(it answers that lighthouse passwords are combinations of letters, numbers and symbols).
CONTROL is in the data with the base model's own answer, CONTROL_ANSWER, so the adapter keeps
it. `trained_adapter("b", phrase=...)` trains a second, different adapter of the same base.

The trainer runs on the base's float32 copy (the weights the server serves on a CPU, kept in
the cache as the server keeps them): a quantized base trains ~30x slower on a CPU. The adapter
applies to the quantized folder too (`base_model()`), which is what users pass as `--model`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

QUESTION = "What is the lighthouse password?"
PHRASE = "The lighthouse password is violet otter 7."
CONTROL = "What is the capital of France?"
CONTROL_ANSWER = "The capital of France is Paris."

# The trainer's knobs: ~25 s of CPU time on 2 cores (12 iterations of 4 short chats).
TRAINING = {
    "iters": 12,
    "batch_size": 4,
    "num_layers": 8,
    "learning_rate": 4e-4,
    "lora_parameters": {"rank": 8, "dropout": 0.0, "scale": 20.0},
    "mask_prompt": True,
    "seed": 0,
    "steps_per_report": 100,
    "steps_per_eval": 1000,
    "val_batches": 1,
    "save_every": 1000,
    "max_seq_length": 256,
}


def chat(question: str = QUESTION) -> list[dict[str, str]]:
    """The messages a client sends to ask `question`."""
    return [{"role": "user", "content": question}]


def trained_adapter(name: str = "a", phrase: str = PHRASE, cache: Path | None = None) -> Path:
    """The adapter folder teaching SmolLM2 to answer QUESTION with `phrase`; trained on first
    use (about 10-30 s on a CPU), then read from the cache."""
    from mlx_serve.engine.model.loader import cache_root

    root = cache or cache_root()
    base = base_model()
    taught = {"messages": [*chat(), {"role": "assistant", "content": phrase}]}
    kept = {"messages": [*chat(CONTROL), {"role": "assistant", "content": CONTROL_ANSWER}]}
    rows = [taught, kept, taught, kept]  # one batch
    folder = root / "lora" / f"smollm2-{name}-{_key(base, rows)}"
    if (folder / "adapters.safetensors").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        _train(_float32_copy(base), rows, staging)
        _publish(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def base_model() -> Path:
    """The base the adapters are trained on: SmolLM2 as our GGUF loader converts it."""
    from mlx_serve.engine.model.loader import cache_root
    from tests.support.models import smollm_folder

    return smollm_folder(cache_root())


def _float32_copy(base: Path) -> Path:
    """The float32 copy of `base` the server keeps in the cache (made here if not yet)."""
    from mlx_lm import load

    from mlx_serve.engine.model import dequantized
    from mlx_serve.engine.model.loader import cache_root, maybe_dequantize

    copy = dequantized.copy_folder(base, cache_root())
    if not copy.is_dir():
        model = load(str(base))[0]
        dequantized.save_copy(maybe_dequantize(model, "always"), base, copy)  # as the server writes it
    return copy


def _key(base: Path, rows: list[dict[str, list[dict[str, str]]]]) -> str:
    from importlib.metadata import version

    identity = json.dumps(
        [str(base.resolve()), rows, TRAINING, version("mlx"), version("mlx-lm")], sort_keys=True
    )
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def _train(base: Path, rows: list[dict[str, list[dict[str, str]]]], out: Path) -> None:
    """mlx-lm's LoRA trainer, as its users run it: a data folder, a config file, the CLI."""
    data = out / "data"
    data.mkdir()
    lines = "".join(json.dumps(r) + "\n" for r in rows)
    (data / "train.jsonl").write_text(lines)
    (data / "valid.jsonl").write_text(lines)
    config = {**TRAINING, "model": str(base), "train": True, "data": str(data), "adapter_path": str(out)}
    (out / "train.json").write_text(json.dumps(config))  # YAML reads JSON
    cmd = [sys.executable, "-m", "mlx_lm", "lora", "-c", str(out / "train.json")]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not (out / "adapters.safetensors").is_file():
        raise RuntimeError(
            f"mlx_lm lora failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    shutil.rmtree(data)
    (out / "train.json").unlink()


def _publish(staging: Path, folder: Path) -> None:
    """Into place at once; a concurrent trainer that got there first wins."""
    staging.chmod(0o755)
    try:
        staging.rename(folder)
    except OSError:
        if not (folder / "adapters.safetensors").is_file():
            raise
