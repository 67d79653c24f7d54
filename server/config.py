"""Command line and TOML configuration: mlx_lm.server's flags plus ours."""

from __future__ import annotations

import argparse
import json
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from mlx_serve.engine.host.build import tool_call_parsers
from mlx_serve.server.models_file import ModelFlag

SECONDS = 1.0
KIB = 1 << 10
MIB = 1 << 20
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# mlx_lm.server flags whose behaviour we do not have yet: refused, never ignored.
NOT_YET: tuple[str, ...] = ()
KV_BITS = (4, 8)  # --kv-bits: the widths the quality tests cover
KV_GROUP_SIZES = (32, 64, 128)
SHARD_MODES = ("tensor", "pipeline")
DRAFT_KINDS = ("ngram", "draft")
SPECULATION_GATES = ("auto", "off")


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


def _parse_size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def _json_object(text: str) -> dict[str, Any]:
    value = json.loads(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _origins(text: str) -> list[str]:
    return [o.strip() for o in text.split(",") if o.strip()]


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlx-serving")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlx-serve",
        description="OpenAI- and Anthropic-compatible LLM server on MLX (drop-in for mlx_lm.server).",
        allow_abbrev=False,
        argument_default=argparse.SUPPRESS,
        epilog="commands: mlx-serve serve|pull|ls|rm|ps|doctor|fit|bench|launch|service ... "
        "(`mlx-serve help` says what each does)",
    )
    a = p.add_argument
    a("--version", action="version", version=f"mlx-serve {package_version()}")
    a("--config", help="TOML file with any of these settings (flags win)")
    a(
        "--model",
        action=ModelFlag,  # --model NAME=SOURCE is one of several
        help="model folder, Hugging Face repo id, or .gguf file (default: SmolLM2-135M-Instruct); "
        "repeat as --model NAME=SOURCE to serve several models by name (docs/many-models.md)",
    )
    a("--models", dest="models_file", help="TOML file of models to serve by name (docs/many-models.md)")
    a(
        "--adapter",
        action="append",
        dest="adapters",
        help="NAME=PATH: a LoRA adapter folder; `model: BASE:NAME` serves BASE with it (repeatable)",
    )
    a("--pin", action="append", help="NAME: a model never unloaded (repeatable)")
    a(
        "--idle-unload-s",
        type=float,
        help="with several models: unload a model after this many seconds without requests (0: never)",
    )
    a(
        "--served-model-name",
        action="append",
        dest="served_model_name",
        help="another name requests may use for the model (repeatable; globs like 'claude-*' allowed)",
    )
    a("--adapter-path", help="LoRA adapter folder")
    a("--host", help="bind address (default 127.0.0.1)")
    a("--port", type=int, help="port (default 8080)")
    a("--temp", type=float, help="default temperature (0.0)")
    a("--top-p", type=float, help="default top-p (1.0)")
    a("--top-k", type=int, help="default top-k (0 = off)")
    a("--min-p", type=float, help="default min-p (0.0 = off)")
    a("--max-tokens", type=int, help="default max new tokens (512)")
    a(
        "--reasoning-budget",
        type=int,
        help="reasoning tokens a request may think before its thinking is closed: -1 unbounded (default), "
        "0 no thinking; a request's thinking_budget_tokens (or Anthropic's budget_tokens) wins",
    )
    a("--reasoning-budget-message", help="text forced before the end of thinking when the budget ends it")
    a("--chat-template", help="chat template replacing the model's: Jinja text, or a path to a .jinja file")
    a(
        "--use-default-chat-template",
        action="store_true",
        help="accepted for mlx_lm.server compatibility, with no effect: the model's own template "
        "(or --chat-template) is always used",
    )
    a("--chat-template-args", type=_json_object, help="JSON object passed to the chat template")
    a("--log-level", type=str.upper, choices=LOG_LEVELS, help="what the log shows (INFO)")
    a("--trust-remote-code", action="store_true", help="allow code from the model repo")
    a("--allowed-origins", type=_origins, help="comma-separated CORS origins (default: CORS off)")
    a("--decode-concurrency", type=int, help="rows decoded together (default: what memory fits, up to 256)")
    a(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="skip compiling the usual kernel shapes, before ready and while idle (GPU backends; a CPU builds its few fused kernels once per machine)",
    )
    a("--prompt-concurrency", type=int, help="prompts prefilled together (8)")
    a("--prefill-step-size", type=int, help="prefill chunk in tokens, and the per-step token budget (2048)")
    a(
        "--max-step-ms",
        type=float,
        help="while rows decode, size prompt chunks so a step takes about this long: lower keeps streams "
        "smoother beside a long prompt, higher prefills it sooner (default: 2.5x a measured decode step, "
        "at least 256 prompt tokens a step; 0: the whole --prefill-step-size every step)",
    )
    a("--max-queue", type=int, help="requests allowed to wait for a batch slot before 429 (64)")
    a(
        "--memory-budget",
        dest="memory_budget_bytes",
        type=_parse_size,
        help="bytes for weights + KV + prefill, e.g. 12G (default: 70%% of RAM on a CPU, 90%% of GPU memory)",
    )
    a("--max-context", type=int, help="cap on prompt + max_tokens per request (default: what fits)")
    a("--prompt-cache-size", type=int, help="max prompt-cache entries (10)")
    a(
        "--prompt-cache-bytes",
        type=_parse_size,
        help="max prompt-cache bytes in memory, e.g. 4G (default: the KV memory running requests leave free)",
    )
    a("--prompt-cache-dir", help="the prompt cache's disk tier (default: ~/.cache/mlx-serve/prompt-cache)")
    a(
        "--prompt-cache-disk-bytes",
        type=_parse_size,
        help="max bytes of the prompt cache's disk tier, e.g. 32G; 0: no disk tier (16G)",
    )
    a("--draft-model", help="draft model for speculative decoding (same tokenizer as --model)")
    a("--num-draft-tokens", type=int, help="draft tokens verified per step, 1-16 (3)")
    a(
        "--draft-kind",
        choices=DRAFT_KINDS,
        help="speculative decoding drafter: ngram (prompt lookup, no second model) or draft "
        "(--draft-model; implied by it); default: no speculative decoding",
    )
    a(
        "--speculation-gate",
        choices=SPECULATION_GATES,
        help="auto: speculate at a batch size only while it measures faster than plain decoding; "
        "off: speculate on every step where a row has drafts (auto)",
    )
    a(
        "--kv-bits",
        type=int,
        help="store the KV cache quantized at 8 or 4 bits (about half or a quarter of bf16's bytes, so "
        "more rows and longer contexts fit); no prefix cache and no speculative decoding with it; "
        "default: unquantized (docs/kv-quantization.md)",
    )
    a("--kv-group-size", type=int, help="--kv-bits quantization group size: 32, 64 or 128 (64)")
    a(
        "--shard",
        choices=SHARD_MODES,
        help="serve one model from every rank of an mlx.launch group: tensor (each rank holds a slice "
        "of every layer) or pipeline (each rank holds some layers); default: one process holds the whole model",
    )
    a("--pipeline", action="store_true", help="the same as --shard pipeline (mlx_lm.server's flag)")
    a("--max-body-bytes", type=_parse_size, help="largest request body (32M)")
    a("--body-timeout-s", type=float, help="seconds a request body may take to arrive, then 408 (60)")
    a("--max-connections", type=int, help="open connections at most; past it only probes answer (1024)")
    a("--max-header-bytes", type=_parse_size, help="largest request head, HTTP/1.1 and HTTP/2 (16K)")
    a("--heartbeat-s", type=float, help="seconds between SSE keep-alive comments (15)")
    a("--startup-timeout-s", type=float, help="seconds allowed for model loading (600)")
    a("--keep-alive-s", type=float, help="idle HTTP keep-alive seconds (75)")
    a(
        "--engine-stall-s",
        type=float,
        help="seconds without an answer from the engine (ten times that without a step), with work "
        "in flight, before it reads as not responding: /health 503, streams get an error (30; 0: off)",
    )
    a(
        "--engine-stall-action",
        choices=["restart", "wait"],
        help="then restart the engine process, or wait for it to step again (restart)",
    )
    a("--blas", help="Linux CPU BLAS: auto (OpenBLAS when installed), bundled, or a .so path")
    a("--seed", type=int, help="global random seed")
    a(
        "--dequantize",
        choices=("auto", "always", "never"),
        help="run quantized weights as float32: auto = on a CPU, where MLX's quantized matmuls "
        "have no BLAS and prefill 10-15x slower (when float32 fits in a quarter of RAM)",
    )
    a(
        "--tool-call-parser",
        choices=tool_call_parsers(),
        metavar="NAME",
        help="the model family's tool-call markup, one of: %(choices)s "
        "(default: what mlx-lm infers from the chat template, else hermes)",
    )
    a(
        "--keep-billing-header",
        action="store_true",
        help="keep Claude Code's `x-anthropic-billing-header` system block in the prompt (default: left "
        "out, as Anthropic does; it changes per version and would end every shared prompt prefix)",
    )
    a(
        "--engine",
        choices=("process", "thread"),
        help="run the model in a restartable child process (default) or a thread of this one",
    )
    # -- deployment: TLS, keys, shutdown, request tracing (issue 6) --
    a("--certfile", help="TLS certificate (PEM); with --keyfile serves HTTPS with ALPN h2")
    a("--keyfile", help="TLS private key (PEM) for --certfile")
    a("--api-key", help="require this key on API routes (prefer --api-key-file or MLX_SERVE_API_KEY)")
    a("--api-key-file", help="file with the accepted API keys, one per line")
    a("--protect-health", action="store_true", help="require the API key on /health too")
    a("--protect-metrics", action="store_true", help="require the API key on /metrics and /stats too")
    a(
        "--shutdown-timeout-s",
        "--shutdown-timeout",
        type=float,
        dest="shutdown_timeout_s",
        help="on SIGTERM, seconds running streams may take to finish before they are ended (30)",
    )
    a("--trace", help="append per-request phase timings to this file as JSON lines")
    a(
        "--no-ui",
        dest="ui",
        action="store_false",
        help="do not serve the page at / (live status and a chat playground); / is then 404",
    )
    return p


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
            values[key] = _parse_size(values[key])
    if isinstance(values.get("allowed_origins"), str):
        values["allowed_origins"] = _origins(values["allowed_origins"])
    return values


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
