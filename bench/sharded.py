"""Sharded serving against one process on the same machine: the same model and load, side by side.

    python -m bench.sharded --model DIR [--modes single,tensor,pipeline] [--concurrency 1,4]
        [--max-tokens 32] [--requests-per-level K] [--json out.json]

`single` is plain mlx-serve; `tensor` and `pipeline` are two ranks started by
`mlx.launch --backend ring -n 2 --hosts 127.0.0.1` (loopback), each rank with one BLAS thread
(OPENBLAS_NUM_THREADS=1), so both contestants use the machine's cores. Both ranks of a group
share one machine's cores and memory: the numbers measure what the collectives and the step
broadcast cost and that batching holds up, not the speed-up a second machine would bring.
Every level uses the load harness of bench.serve_compare (streaming chat, temperature 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from bench.load import LoadSpec, run_level
from bench.prompts import PromptBook, load_tokenizer
from bench.report import HEADER, LevelSummary, fmt, summarize
from bench.servers import (
    REPO_ROOT,
    RunningServer,
    ServerSpec,
    ServerStartError,
    free_port,
    stop_server,
    wait_healthy,
)

MODES = ("single", "tensor", "pipeline")
FOLLOWERS: list[subprocess.Popen[bytes]] = []


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, required=True, help="an mlx-lm model folder")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--rounds", type=int, default=1, help="run every contestant this many times, in turn")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--requests-per-level", type=int, default=None, help="K (default 2C, at least 2)")
    p.add_argument("--mlx-serve-args", default="", help="extra flags for every contestant")
    p.add_argument(
        "--launcher",
        choices=("mlx.launch", "env"),
        default="mlx.launch",
        help="env: start both ranks here with mlx.launch's environment (no I/O relay)",
    )
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/mlx-serve-bench-sharded"))
    p.add_argument("--json", type=Path, default=None)
    return p.parse_args(argv)


def start(mode: str, model: Path, extra: list[str], log_dir: Path, launcher: str) -> RunningServer:
    """A contestant on a free port, in its own session (stopping it ends every rank)."""
    port = free_port()
    serve = [sys.executable, "-m", "server", "--model", str(model), "--port", str(port), *extra]
    env, log_path = dict(os.environ), log_dir / f"{mode}.log"
    if mode == "single":
        argv = serve
    elif launcher == "mlx.launch":
        ring, tool = free_port(), str(Path(sys.executable).parent / "mlx.launch")
        argv = [
            tool,
            "--backend",
            "ring",
            "--hosts",
            "127.0.0.1",
            "-n",
            "2",
            "--starting-port",
            str(ring),
            "--env",
            "OPENBLAS_NUM_THREADS=1",
            "--",
            *serve,
            "--shard",
            mode,
        ]
    else:  # what mlx.launch sets up, without its I/O relay: rank 1 here, rank 0 below
        argv = [*serve, "--shard", mode]
        hostfile = log_dir / "hosts.json"
        hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"], [f"127.0.0.1:{free_port()}"]]))
        env |= {"OPENBLAS_NUM_THREADS": "1", "MLX_HOSTFILE": str(hostfile)}
        with (log_dir / f"{mode}-rank1.log").open("wb") as log:
            follower = subprocess.Popen(
                argv, cwd=REPO_ROOT, env=env | {"MLX_RANK": "1"}, stdout=log, stderr=subprocess.STDOUT
            )
        env |= {"MLX_RANK": "0"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    if mode != "single" and launcher == "env":
        FOLLOWERS.append(follower)  # it leaves when rank 0 stops (engine.host.shard.watch); main() waits
    spec = ServerSpec(f"{mode}", model, extra, env, REPO_ROOT)
    return RunningServer(spec, argv, proc, f"http://127.0.0.1:{port}", log_path)


async def measure(
    server: RunningServer, levels: list[int], args: argparse.Namespace, book: PromptBook
) -> list[LevelSummary]:
    await wait_healthy(server, args.startup_timeout)
    out, first = [], 0
    warm = LoadSpec(1, 1, 8, 10_000, "default_model", book.get)
    await run_level(server.base_url, warm)
    for c in levels:
        k = args.requests_per_level or max(2, 2 * c)
        spec = LoadSpec(c, k, args.max_tokens, first, "default_model", book.get)
        out.append(summarize(server.spec.name, await run_level(server.base_url, spec)))
        first += k
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    args.log_dir.mkdir(parents=True, exist_ok=True)
    book = PromptBook(None, load_tokenizer(args.model), same_prompt=False)
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, load average "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}; model {args.model}; max_tokens {args.max_tokens}"
    )
    results: dict[str, list[LevelSummary]] = {}
    for round_ in range(1, args.rounds + 1):  # contestants alternate: a shared machine's load drifts
        for mode in args.modes.split(","):
            name = mode if args.rounds == 1 else f"{mode}#{round_}"  # single#2 pairs with tensor#2
            load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
            server = start(mode, args.model, args.mlx_serve_args.split(), args.log_dir, args.launcher)
            try:
                results[name] = [
                    replace(x, server=name) for x in asyncio.run(measure(server, levels, args, book))
                ]
            except ServerStartError as exc:  # e.g. a family with no pipeline sharding: report the rest
                print(f"{name}: did not start: {exc}", flush=True)
                continue
            finally:
                stop_server(server)
                for follower in FOLLOWERS:
                    follower.wait(60)
            print(f"{name}: done (load average before it {load}; log {server.log_path})", flush=True)
    report(results, levels)
    if args.json is not None:
        args.json.write_text(json.dumps({m: [s.__dict__ for s in r] for m, r in results.items()}, indent=1))


def report(results: dict[str, list[LevelSummary]], levels: list[int]) -> None:
    for i, c in enumerate(levels):
        print(f"\n== concurrency {c} ==\n{HEADER}")
        for s in (r[i] for r in results.values()):
            print(
                f"{s.server:<10} {f'{s.ok}/{s.errors}':>8} {fmt(s.ttft_p50_ms):>10} {fmt(s.ttft_p95_ms):>10} "
                f"{fmt(s.decode_p50_tps):>11} {fmt(s.aggregate_tps):>10} {fmt(s.mean_completion_tokens, 0):>8} "
                f"{s.wall_s:>7.1f}"
            )
            print("".join(f"   error: {e}\n" for e in s.error_samples), end="")
        for name, r in results.items():
            single = results.get(name.replace("tensor", "single").replace("pipeline", "single"))
            if not name.startswith("single") and single is not None and single[i].aggregate_tps:
                print(
                    f"   {name} / single aggregate tok/s: {r[i].aggregate_tps / single[i].aggregate_tps:.2f}x"
                )


if __name__ == "__main__":
    main()
