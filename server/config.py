"""The configuration: defaults, then a TOML file (`--config`), then the flags (server.flags),
into one Config, checked together before anything starts."""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mlx_serve.engine.host.build import tool_call_parsers
from mlx_serve.server.flags import (
    KIB,
    KV_BITS,
    KV_GROUP_SIZES,
    LOG_LEVELS,
    MIB,
    NOT_YET,
    SECONDS,
    SHARD_MODES,
    build_parser,
    parse_origins,
    parse_size,
)


@dataclass(slots=True)
class Config:
    """Every setting, with units in the names where they have units."""

    model: str | None = None
    served_model_name: list[str] = field(default_factory=list)
    # -- many models (server.many): --models FILE, --model NAME=SOURCE, --adapter, --pin --
    models_file: str | None = None
    named_models: list[str] = field(default_factory=list)  # each `--model NAME=SOURCE`
    adapters: list[str] = field(default_factory=list)  # each `--adapter NAME=PATH`
    pin: list[str] = field(default_factory=list)
    idle_unload_s: float = 0.0  # 0: never
    adapter_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    temp: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 512
    reasoning_budget: int = -1  # llama.cpp's: reasoning tokens before thinking is closed; -1 unbounded
    reasoning_budget_message: str = ""
    chat_template: str = ""
    use_default_chat_template: bool = False
    chat_template_args: dict[str, Any] = field(default_factory=dict)
    log_level: str = "INFO"
    trust_remote_code: bool = False
    allowed_origins: list[str] = field(default_factory=list)
    warmup: bool = True
    decode_concurrency: int | None = None  # None: what the memory plan fits, up to 256
    prompt_concurrency: int = 8
    prefill_step_size: int = 2048
    max_step_ms: float | None = None  # None: 2.5 × a measured decode step (engine.batch.step_cost); 0: off
    max_queue: int = 64
    memory_budget_bytes: int | None = None
    max_context: int | None = None
    prompt_cache_size: int = 10
    prompt_cache_bytes: int | None = None
    prompt_cache_dir: str | None = None
    prompt_cache_disk_bytes: int = 16 << 30
    draft_model: str | None = None
    num_draft_tokens: int = 3
    draft_kind: str | None = None
    speculation_gate: str = "auto"
    kv_bits: int | None = None  # KV stored quantized at this many bits (engine.rows.quantized_kv)
    kv_group_size: int = 64
    shard: str | None = None  # "tensor" or "pipeline" across an mlx.launch group (engine.host.shard)
    pipeline: bool = False  # mlx_lm.server's flag: the same as shard = "pipeline"
    max_body_bytes: int = 32 * MIB
    body_timeout_s: float = 60 * SECONDS
    max_connections: int = 1024
    max_header_bytes: int = 16 * KIB
    heartbeat_s: float = 15 * SECONDS
    startup_timeout_s: float = 600 * SECONDS
    keep_alive_s: float = 75 * SECONDS
    engine_stall_s: float = 30 * SECONDS  # no engine step this long, work in flight: not responding (0: off)
    engine_stall_action: str = "restart"  # or "wait": fail the streams, then wait for it to step again
    ui: bool = True  # the page at / (status view and chat playground); --no-ui: / is 404
    blas: str = "auto"
    engine: str = "process"
    dequantize: str = "auto"
    seed: int | None = None
    tool_call_parser: str | None = None
    keep_billing_header: bool = False  # Claude Code's x-anthropic-billing-header reaches the prompt
    # -- deployment: TLS, keys, shutdown, request tracing (issue 6) --
    certfile: str | None = None
    keyfile: str | None = None
    api_key: str | None = None
    api_key_file: str | None = None
    protect_health: bool = False
    protect_metrics: bool = False
    shutdown_timeout_s: float = 30 * SECONDS
    trace: str | None = None


def load_config(argv: list[str] | None = None) -> Config:
    """Defaults, then the TOML file, then flags. Unknown flags and keys are errors."""
    parser = build_parser()
    flags = vars(parser.parse_args(argv))
    values: dict[str, Any] = {}
    if "config" in flags:
        values.update(_read_toml(Path(flags.pop("config")), parser))
    values.update(flags)
    cfg = Config(**values)
    _check(cfg, parser)
    return cfg


def _read_toml(path: Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        parser.error(f"--config {path}: {exc}")
    known = {f.name for f in fields(Config)}
    values = {k.replace("-", "_"): v for k, v in raw.items()}
    if "memory_budget" in values:  # the flag's name, --memory-budget
        values["memory_budget_bytes"] = values.pop("memory_budget")
    unknown = sorted(set(values) - known)
    if unknown:
        parser.error(f"--config {path}: unknown settings {', '.join(unknown)}")
    for key in (
        "prompt_cache_bytes",
        "prompt_cache_disk_bytes",
        "memory_budget_bytes",
        "max_body_bytes",
        "max_header_bytes",
    ):
        if isinstance(values.get(key), str):
            values[key] = parse_size(values[key])
    if isinstance(values.get("allowed_origins"), str):
        values["allowed_origins"] = parse_origins(values["allowed_origins"])
    _named_models(values, path, parser)
    return values


def _named_models(values: dict[str, Any], path: Path, parser: argparse.ArgumentParser) -> None:
    """`model = "NAME=SOURCE"` or a list of them, as repeated `--model NAME=SOURCE` flags."""
    from mlx_serve.server.models_file import is_named

    model = values.get("model")
    if not (isinstance(model, list) or (isinstance(model, str) and is_named(model))):
        return
    given = model if isinstance(model, list) else [model]
    if not all(isinstance(m, str) and is_named(m) for m in given):
        parser.error(f"--config {path}: `model` as a list wants NAME=SOURCE strings, got {model!r}")
    del values["model"]
    values["named_models"] = [*values.get("named_models", []), *given]


def _check(cfg: Config, parser: argparse.ArgumentParser) -> None:
    for name in NOT_YET:
        if getattr(cfg, name):
            parser.error(f"--{name.replace('_', '-')} is not supported yet")
    if cfg.draft_model and cfg.draft_kind is None:
        cfg.draft_kind = "draft"
    if cfg.draft_kind == "draft" and not cfg.draft_model:
        parser.error("--draft-kind draft needs --draft-model")
    if cfg.draft_kind == "ngram" and cfg.draft_model:
        parser.error("--draft-model drafts with a model; it cannot be combined with --draft-kind ngram")
    if not 1 <= cfg.num_draft_tokens <= 16:
        parser.error("--num-draft-tokens must be between 1 and 16")
    if not 0 < cfg.port < 65536:
        parser.error(f"--port {cfg.port} is out of range")
    if cfg.max_step_ms is not None and cfg.max_step_ms < 0:
        parser.error("--max-step-ms must be 0 (off) or more")
    if cfg.max_tokens < 1:
        parser.error("--max-tokens must be at least 1")
    if cfg.reasoning_budget < -1:
        parser.error("--reasoning-budget must be -1 (unbounded), 0 (no thinking) or more")
    if cfg.log_level.upper() not in LOG_LEVELS:
        parser.error(f"log level must be one of {', '.join(LOG_LEVELS)}")
    if cfg.tool_call_parser is not None and cfg.tool_call_parser not in tool_call_parsers():
        parser.error(
            f"--tool-call-parser {cfg.tool_call_parser!r} is not one of {', '.join(tool_call_parsers())}"
        )
    _check_deploy(cfg, parser)
    _check_many(cfg, parser)
    _check_shard(cfg, parser)
    _check_kv_bits(cfg, parser)


def _check_many(cfg: Config, parser: argparse.ArgumentParser) -> None:
    from mlx_serve.server.models_file import many_models_problem

    problem = many_models_problem(
        cfg.models_file, cfg.model, cfg.served_model_name, cfg.named_models, cfg.adapters, cfg.pin
    )
    if cfg.idle_unload_s < 0:
        problem = "--idle-unload-s must be 0 (never) or more"
    if cfg.shard and (cfg.models_file or cfg.named_models or cfg.adapters):
        problem = (
            "--shard serves one model; it cannot be combined with several (--models, --model NAME=SOURCE)"
        )
    if problem:
        parser.error(problem)


def _check_kv_bits(cfg: Config, parser: argparse.ArgumentParser) -> None:
    if cfg.kv_group_size not in KV_GROUP_SIZES:
        parser.error(f"--kv-group-size must be one of {', '.join(map(str, KV_GROUP_SIZES))}")
    if cfg.kv_bits is None:
        return
    if cfg.kv_bits not in KV_BITS:
        parser.error(f"--kv-bits must be one of {', '.join(map(str, KV_BITS))}")
    if cfg.draft_kind:
        parser.error(
            f"--kv-bits cannot be combined with --draft-kind {cfg.draft_kind} (speculative decoding)"
        )
    if cfg.shard:
        parser.error("--kv-bits cannot be combined with --shard")


def _check_shard(cfg: Config, parser: argparse.ArgumentParser) -> None:
    if cfg.pipeline:
        if cfg.shard not in (None, "pipeline"):
            parser.error(f"--pipeline means --shard pipeline; it cannot be combined with --shard {cfg.shard}")
        cfg.shard = "pipeline"
    if cfg.shard is None:
        return
    if cfg.shard not in SHARD_MODES:
        parser.error(f"--shard must be one of {', '.join(SHARD_MODES)}")
    clashes = {
        "--draft-model": cfg.draft_model,
        "--draft-kind": cfg.draft_kind,
        "--adapter-path": cfg.adapter_path,
        "--engine thread": cfg.engine == "thread",
    }
    for flag, value in clashes.items():
        if value:
            parser.error(f"{flag} cannot be combined with --shard (see README: Sharding)")


def _check_deploy(cfg: Config, parser: argparse.ArgumentParser) -> None:
    if (cfg.certfile is None) != (cfg.keyfile is None):
        parser.error("--certfile and --keyfile go together")
    if cfg.api_key == "":
        parser.error("--api-key must not be empty")
    if cfg.shutdown_timeout_s < 0:
        parser.error("--shutdown-timeout-s must not be negative")
    if cfg.max_connections < 1 or cfg.body_timeout_s <= 0 or cfg.max_header_bytes < 1024:
        parser.error("--max-connections must be >= 1, --body-timeout-s > 0, --max-header-bytes >= 1K")
