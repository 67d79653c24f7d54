"""Which models one server serves: `--models FILE` (TOML), repeated `--model NAME=SOURCE` and
`--adapter NAME=PATH`, read into one ModelEntry per name a request may pick.

A models file is a list of `[[models]]` tables:

    [[models]]
    name = "coder"                      # what /v1/models lists and requests name
    source = "qwen2.5-coder-1.5b"       # a folder, a .gguf file, a package shortcut or a Hub id
    aliases = ["claude-*"]              # other names, globs allowed
    draft_model = "qwen2.5-coder-0.5b"  # and tool_call_parser, chat_template
    max_context = 32768                 # per-model limits: max_context, decode_concurrency
    idle_unload_s = 600                 # free it after this long without requests (0: never)
    pinned = true                       # never unloaded
    adapters = { sql = "adapters/sql" } # `model: "coder:sql"` selects the base with that adapter

The first entry is the default: a request without `model` (or with "default") gets it.
"""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any


class ModelsFileError(ValueError):
    """A models file or a --model/--adapter flag that cannot be served: the message says where."""


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One servable model: its names, where it loads from, and its own limits."""

    name: str
    source: str | None = None  # None: the default model (SmolLM2)
    aliases: tuple[str, ...] = ()
    draft_model: str | None = None
    tool_call_parser: str | None = None
    chat_template: str = ""
    max_context: int | None = None
    decode_concurrency: int | None = None
    idle_unload_s: float | None = None  # None: the server's --idle-unload-s; 0: never
    pinned: bool = False
    adapter_path: str | None = None
    adapters: tuple[tuple[str, str], ...] = ()  # (name, path): the `base:name` variants


LIST_KEYS = ("aliases",)
SCALAR_KEYS = {f.name for f in fields(ModelEntry)} - {"adapters", "aliases", "adapter_path"}


def read_models_file(path: Path) -> list[ModelEntry]:
    """The entries of a models file, in order; every key checked."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ModelsFileError(f"--models {path}: {exc}") from exc
    unknown = sorted(set(raw) - {"models"})
    if unknown:
        raise ModelsFileError(
            f"--models {path}: unknown top-level keys {', '.join(unknown)} (want [[models]])"
        )
    tables = raw.get("models")
    if not isinstance(tables, list) or not tables:
        raise ModelsFileError(f"--models {path}: no [[models]] entries")
    return [_entry(t, f"--models {path}: entry {i + 1}") for i, t in enumerate(tables)]


def _entry(table: Any, where: str) -> ModelEntry:
    if not isinstance(table, dict):
        raise ModelsFileError(f"{where}: not a table")
    values = {k.replace("-", "_"): v for k, v in table.items()}
    name = values.get("name")
    if not isinstance(name, str) or not name:
        raise ModelsFileError(f"{where}: `name` (a string) is required")
    unknown = sorted(set(values) - SCALAR_KEYS - {"aliases", "adapters"})
    if unknown:
        raise ModelsFileError(f"{where} ({name}): unknown keys {', '.join(unknown)}")
    aliases = values.pop("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise ModelsFileError(f"{where} ({name}): `aliases` must be a list of strings")
    adapters = values.pop("adapters", {})
    if not isinstance(adapters, dict) or not all(isinstance(p, str) for p in adapters.values()):
        raise ModelsFileError(f"{where} ({name}): `adapters` must be a table of name = path")
    _check_types(values, f"{where} ({name})")
    return ModelEntry(aliases=tuple(aliases), adapters=tuple(adapters.items()), **values)


INT_KEYS = ("max_context", "decode_concurrency")


def _check_types(values: dict[str, Any], where: str) -> None:
    for key in INT_KEYS:
        if key in values and (not isinstance(values[key], int) or values[key] < 1):
            raise ModelsFileError(f"{where}: `{key}` must be a positive integer")
    idle = values.get("idle_unload_s")
    if idle is not None and (not isinstance(idle, int | float) or idle < 0):
        raise ModelsFileError(f"{where}: `idle_unload_s` must be 0 (never) or more seconds")
    if "pinned" in values and not isinstance(values["pinned"], bool):
        raise ModelsFileError(f"{where}: `pinned` must be true or false")
    for key in ("source", "draft_model", "tool_call_parser", "chat_template"):
        if key in values and not isinstance(values[key], str):
            raise ModelsFileError(f"{where}: `{key}` must be a string")


def split_pair(text: str, flag: str) -> tuple[str, str]:
    """NAME=VALUE of a repeated flag."""
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise ModelsFileError(f"{flag} wants NAME=VALUE, got {text!r}")
    return name, value


def is_named(model_arg: str) -> bool:
    """`--model NAME=SOURCE` names its model; a plain `--model SOURCE` (a path may hold no '=')
    keeps the one-model server."""
    name, sep, _ = model_arg.partition("=")
    return bool(sep) and bool(name) and "/" not in name


def entries_from_flags(
    models: list[str], file_entries: list[ModelEntry], adapters: list[str], pinned: list[str]
) -> list[ModelEntry]:
    """The file's entries, then each `--model NAME=SOURCE`; `--adapter` applies to every base;
    `--pin NAME` pins it. Names must be unique."""
    out = list(file_entries)
    for arg in models:
        name, source = split_pair(arg, "--model")
        out.append(ModelEntry(name=name, source=source))
    extra = tuple(split_pair(a, "--adapter") for a in adapters)
    out = [replace(e, adapters=e.adapters + extra) for e in out]
    names = [e.name for e in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ModelsFileError(f"model names must be unique: {', '.join(duplicates)} is given twice")
    for name in pinned:
        if name not in names:
            raise ModelsFileError(f"--pin {name}: no model of that name (models: {', '.join(names)})")
    return [replace(e, pinned=e.pinned or e.name in pinned) for e in out]


def with_adapters(entries: list[ModelEntry]) -> list[ModelEntry]:
    """Each base entry, then its `base:adapter` variants (each its own engine)."""
    out: list[ModelEntry] = []
    for e in entries:
        out.append(e)
        for adapter, path in e.adapters:
            out.append(
                replace(
                    e, name=f"{e.name}:{adapter}", aliases=(), adapter_path=path, adapters=(), pinned=False
                )
            )
    return out


def all_entries(
    models_file: str | None,
    model: str | None,
    served_model_name: list[str],
    named_models: list[str],
    adapters: list[str],
    pinned: list[str],
) -> list[ModelEntry]:
    """The models file's entries (a plain --model first, its --served-model-name its name and
    aliases), then each --model NAME=SOURCE; then every `base:adapter` variant."""
    from mlx_serve.engine.model.loader import served_id

    listed = read_models_file(Path(models_file)) if models_file else []
    if model is not None:  # named by its first --served-model-name that is not a glob, else its id
        plain = [n for n in served_model_name if not set("*?[") & set(n)]
        name = plain[0] if plain else served_id(model)
        aliases = tuple(n for n in served_model_name if n != name)
        listed = [ModelEntry(name=name, source=model, aliases=aliases), *listed]
    elif not listed and not named_models:  # only --adapter: the default model is the base
        listed = [ModelEntry(name=served_id(None))]
    return with_adapters(entries_from_flags(named_models, listed, adapters, pinned))


def many_models_problem(
    models_file: str | None,
    model: str | None,
    served_model_name: list[str],
    named_models: list[str],
    adapters: list[str],
    pinned: list[str],
) -> str | None:
    """What is wrong with the flags' models, said for the command line; None: nothing."""
    if not (models_file or named_models or adapters):
        return "--pin names a model of --models or --model NAME=SOURCE" if pinned else None
    if served_model_name and model is None:
        return "--served-model-name names the plain --model; with several models give `aliases` in --models"
    try:
        all_entries(models_file, model, served_model_name, named_models, adapters, pinned)
    except ModelsFileError as exc:
        return str(exc)
    return None


class ModelFlag(argparse.Action):
    """--model SOURCE (the one model) or --model NAME=SOURCE (one of several, repeatable)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        if is_named(str(values)):
            namespace.named_models = [*getattr(namespace, "named_models", []), str(values)]
        else:
            namespace.model = values
