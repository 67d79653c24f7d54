"""mlx-serve's command line: every flag, its default and its help (mlx_lm.server's flags plus
ours). server.config reads them, with the TOML file, into a Config and checks them together."""

from __future__ import annotations

import argparse
import json
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


def parse_size(text: str) -> int:
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


def parse_origins(text: str) -> list[str]:
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
    a("--allowed-origins", type=parse_origins, help="comma-separated CORS origins (default: CORS off)")
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
        type=parse_size,
        help="bytes for weights + KV + prefill, e.g. 12G (default: 70%% of RAM on a CPU, 90%% of GPU memory)",
    )
    a("--max-context", type=int, help="cap on prompt + max_tokens per request (default: what fits)")
    a("--prompt-cache-size", type=int, help="max prompt-cache entries (10)")
    a(
        "--prompt-cache-bytes",
        type=parse_size,
        help="max prompt-cache bytes in memory, e.g. 4G (default: the KV memory running requests leave free)",
    )
    a("--prompt-cache-dir", help="the prompt cache's disk tier (default: ~/.cache/mlx-serve/prompt-cache)")
    a(
        "--prompt-cache-disk-bytes",
        type=parse_size,
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
    a("--max-body-bytes", type=parse_size, help="largest request body (32M)")
    a("--body-timeout-s", type=float, help="seconds a request body may take to arrive, then 408 (60)")
    a("--max-connections", type=int, help="open connections at most; past it only probes answer (1024)")
    a("--max-header-bytes", type=parse_size, help="largest request head, HTTP/1.1 and HTTP/2 (16K)")
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
