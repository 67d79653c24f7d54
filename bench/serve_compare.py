"""Side-by-side serving benchmark: mlx-serve vs mlx_lm.server vs direct mlx-lm, in one run.

    python -m bench.serve_compare --model DIR|FILE.gguf [--prompt-tokens N] [--max-tokens 128]
        [--concurrency 1,4,16,64] [--requests-per-level K] [--servers mlx-serve,mlx_lm]
        [--no-warmup] [--openblas] [--env KEY=VAL ...] [--json out.json]

Each server runs alone as a subprocess on a free port with the same environment; after /health
answers 200, each concurrency level is warmed up (C concurrent short requests) and then measured
closed-loop (C clients, K streaming greedy chat requests). Direct mlx-lm `stream_generate` runs
first in its own process. Prints a table per level, ratio lines, and the machine and BLAS used.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from bench.load import RequestRecord
from bench.prompts import PromptBook, load_tokenizer
from bench.report import LevelSummary, level_table, ratio_lines, summarize
from bench.runs import LoadPlan, ServerOutcome, run_direct, run_servers
from bench.servers import SERVER_NAMES, ServerSpec, server_cwd

OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", required=True, help="mlx-lm model folder, or a .gguf file (needs engine.gguf.convert)"
    )
    p.add_argument("--prompt-tokens", type=int, default=None, help="pad prompts to about N tokens")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", default="1,4,16,64", help="comma-separated client counts")
    p.add_argument("--requests-per-level", type=int, default=None, help="K (default max(4, 2C))")
    p.add_argument("--servers", default=",".join(SERVER_NAMES))
    p.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--warmup-tokens", type=int, default=16)
    p.add_argument("--direct-runs", type=int, default=3, help="timed direct runs (0: skip direct)")
    p.add_argument("--same-prompt", action="store_true", help="one prompt for every request")
    p.add_argument("--openblas", action="store_true", help="LD_PRELOAD OpenBLAS for mlx_lm and direct")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL", help="for every process")
    p.add_argument(
        "--mlx-serve-args",
        default="",
        help="extra mlx-serve arguments, one string: --mlx-serve-args='--flag v'",
    )
    p.add_argument(
        "--mlx-lm-args",
        default="",
        help="extra mlx_lm.server arguments, one string: --mlx-lm-args='--flag v'",
    )
    p.add_argument("--request-model", default="default_model", help="the request's 'model' field")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument(
        "--client-processes",
        type=int,
        default=None,
        help="spread the clients of a level over this many processes (default: one per 8 "
        "clients, at most a quarter of the CPUs; 1 on small machines)",
    )
    p.add_argument("--log-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def resolve_model(model: str) -> Path:
    """A model folder as is; a .gguf converted once by engine.gguf.convert_gguf."""
    path = Path(model)
    if path.suffix != ".gguf":
        return path
    try:
        from engine.gguf.convert import convert_gguf
    except ImportError as exc:
        sys.exit(f"--model {model}: a .gguf needs engine.gguf.convert_gguf ({exc})")
    return Path(convert_gguf(path))


def environments(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, str]]:
    """(env for mlx-serve, env for mlx_lm.server and direct runs)."""
    base = dict(os.environ)
    for pair in args.env:
        key, _, value = pair.partition("=")
        base[key] = value
    others = dict(base)
    if args.openblas:
        if Path(OPENBLAS).exists():
            others["LD_PRELOAD"] = ":".join(p for p in (OPENBLAS, base.get("LD_PRELOAD", "")) if p)
        else:
            print(f"warning: --openblas: {OPENBLAS} not found (apt-get install libopenblas0-pthread)")
    return base, others


def server_specs(
    args: argparse.Namespace,
    model_dir: Path,
    log_dir: Path,
    ours_env: dict[str, str],
    others_env: dict[str, str],
) -> list[ServerSpec]:
    specs = []
    for name in [n.strip() for n in args.servers.split(",") if n.strip()]:
        if name not in SERVER_NAMES:
            sys.exit(f"--servers: unknown {name!r}; choose from {SERVER_NAMES}")
        extra = (args.mlx_serve_args if name == "mlx-serve" else args.mlx_lm_args).split()
        env = ours_env if name == "mlx-serve" else others_env
        specs.append(ServerSpec(name, model_dir, extra, env, server_cwd(name, log_dir)))
    return specs


def describe_blas(libs: list[str], banner: list[str]) -> str:
    names = " ".join(os.path.basename(lib).lower() for lib in libs)
    if "openblas" in names:
        kind = "OpenBLAS"
    elif "mkl" in names:
        kind = "MKL"
    elif any("mlx_cpu.libs" in lib for lib in libs):
        kind = "bundled reference BLAS (netlib)"
    else:
        kind = "no BLAS library mapped" if platform.system() == "Linux" else "platform BLAS"
    return kind + (f"; banner: {banner[0]}" if banner else "")


def print_machine(machine: dict[str, object], direct_blas: str) -> None:
    print("\n== machine ==")
    print(
        f"platform {machine.get('platform')}  cpus {machine.get('cpu_count')}  python {machine.get('python')}"
    )
    print(
        f"mlx {machine.get('mlx_version')} (device {machine.get('mlx_device')})  mlx-lm {machine.get('mlx_lm_version')}"
    )
    print(f"direct mlx-lm BLAS: {direct_blas}  LD_PRELOAD={machine.get('ld_preload') or '(none)'}")
    load = machine.get("loadavg_start"), machine.get("loadavg_end")
    print(
        f"load average (1 min) at start {load[0]}, at end {load[1]}: other work on the machine skews numbers"
    )


def direct_summary(direct: dict[str, object]) -> dict[str, float] | None:
    runs = direct.get("runs")
    if not isinstance(runs, list) or not runs:
        return None
    keys = ("generation_tps", "prompt_tps", "ttft_s", "generation_tokens", "prompt_tokens")
    return {k: sorted(float(r[k]) for r in runs)[len(runs) // 2] for k in keys}


def print_direct(direct: dict[str, object], summary: dict[str, float] | None) -> None:
    if summary is None:
        print(f"\ndirect mlx-lm: {direct.get('error', 'skipped')}")
        return
    print(
        f"\ndirect mlx-lm stream_generate (median of {len(direct['runs'])}): "  # type: ignore[arg-type]
        f"decode {summary['generation_tps']:.1f} tok/s, prompt {summary['prompt_tps']:.1f} tok/s, "
        f"TTFT {summary['ttft_s'] * 1000:.0f} ms, {summary['prompt_tokens']:.0f} prompt / "
        f"{summary['generation_tokens']:.0f} generated tokens"
    )


def print_servers(outcomes: list[ServerOutcome]) -> None:
    for o in outcomes:
        blas = describe_blas(o.blas_libs, o.blas_banner)
        state = f"ERROR {o.error}" if o.error else f"ready in {o.startup_s or 0:.1f} s"
        print(f"{o.name}: {state}\n   BLAS: {blas}\n   log: {o.log_path}")


def tables(outcomes: list[ServerOutcome]) -> dict[int, dict[str, LevelSummary]]:
    by_level: dict[int, dict[str, LevelSummary]] = {}
    for o in outcomes:
        for level in o.levels:
            by_level.setdefault(level.concurrency, {})[o.name] = summarize(o.name, level)
    for c, row in sorted(by_level.items()):
        print(level_table(c, list(row.values())))
    return by_level


def record_json(record: RequestRecord) -> dict[str, object]:
    return asdict(record) | {
        "ttft_s": record.ttft_s,
        "decode_tps": record.decode_tps,
        "num_tokens": record.num_tokens,
    }


def outcome_json(o: ServerOutcome, by_level: dict[int, dict[str, LevelSummary]]) -> dict[str, object]:
    levels = [
        {
            "concurrency": lvl.concurrency,
            "wall_s": lvl.wall_s,
            "summary": asdict(by_level[lvl.concurrency][o.name]),
            "records": [record_json(r) for r in lvl.records],
        }
        for lvl in o.levels
    ]
    fields = {k: v for k, v in asdict(o).items() if k != "levels"} | {"log_path": str(o.log_path)}
    return fields | {"blas": describe_blas(o.blas_libs, o.blas_banner), "levels": levels}


def write_json(
    path: Path,
    args: argparse.Namespace,
    model_dir: Path,
    machine: dict[str, object],
    direct: dict[str, object],
    direct_stats: dict[str, float] | None,
    outcomes: list[ServerOutcome],
    by_level: dict[int, dict[str, LevelSummary]],
) -> None:
    result = {
        "config": vars(args) | {"model_dir": str(model_dir)},
        "machine": machine,
        "direct": direct | {"median": direct_stats},
        "servers": {o.name: outcome_json(o, by_level) for o in outcomes},
        "summaries": [asdict(s) for row in by_level.values() for s in row.values()],
    }
    path.write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {path}")


def default_client_processes() -> int:
    """Up to a quarter of the CPUs for the load clients, none extra on a small machine (there
    the servers need every core, and a few streams are all one client process reads anyway)."""
    return max(1, (os.cpu_count() or 1) // 4)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model_dir = resolve_model(args.model)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-serve-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    levels = list(dict.fromkeys(int(c) for c in args.concurrency.split(",") if c.strip()))
    plan = LoadPlan(
        levels,
        args.requests_per_level,
        args.max_tokens,
        args.warmup,
        args.warmup_tokens,
        args.request_model,
        args.startup_timeout,
        args.client_processes if args.client_processes is not None else default_client_processes(),
    )
    book = PromptBook(args.prompt_tokens, load_tokenizer(model_dir), args.same_prompt)
    ours_env, direct_env = environments(args)
    specs = server_specs(args, model_dir, log_dir, ours_env, direct_env)
    load_start = round(os.getloadavg()[0], 2)
    print(f"model {model_dir}; levels {levels}; max_tokens {args.max_tokens}; logs in {log_dir}", flush=True)
    direct = run_direct(model_dir if args.direct_runs else None, book, plan, args.direct_runs, direct_env)
    direct_stats = direct_summary(direct)
    print_direct(direct, direct_stats)
    outcomes = run_servers(specs, plan, book, log_dir)
    machine = direct.get("machine") or run_direct(None, book, plan, 0, direct_env).get("machine") or {}
    machine |= {"loadavg_start": load_start, "loadavg_end": round(os.getloadavg()[0], 2)}
    print_machine(machine, describe_blas(list(machine.get("blas_libs", [])), []))
    print_servers(outcomes)
    by_level = tables(outcomes)
    print("\n".join(ratio_lines(by_level, direct_stats["generation_tps"] if direct_stats else None)))
    if args.json:
        write_json(args.json, args, model_dir, machine, direct, direct_stats, outcomes, by_level)


if __name__ == "__main__":
    main()
