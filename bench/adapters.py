"""Two LoRA adapters of one base: rows of both as two engines (separate batches, the server's
`--adapter NAME=PATH` and `model: "base:NAME"`) against rows of one adapter in one batch.

    python -m bench.adapters [--clients 8] [--max-tokens 64] [--rounds 2] [--json OUT]

One mlx-serve serves SmolLM2 (or `--model`) with adapters `a` and `b` (default: the two that
tests.lora_fixture trains with mlx-lm's trainer; `--adapter-a`/`--adapter-b` for others). Each
round runs C streaming clients all on `base:a` (one engine, one batch of C rows), then C/2 on
`base:a` beside C/2 on `base:b` (two engines, two batches of C/2 rows), in alternating order.
Prints aggregate tokens/s of each and their ratio, and the server's resident memory (all its
processes) with one adapter engine loaded and with two; and, in this process, mlx-lm's decode
step with and without LoRA layers at batch C and C/2 (what a shared multi-adapter batch could
at best run at). Same machine, same run: `machine:` line first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench import machine
from bench.common import model_folder
from bench.load import LevelResult, LoadSpec, run_level
from bench.prompts import build_prompt, load_tokenizer
from bench.servers import REPO_ROOT, ServerSpec, descendants, start_server, stop_server, wait_healthy

NAME = "smol"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.adapters", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="base model (default SmolLM2-135M)")
    p.add_argument("--adapter-a", default=None)
    p.add_argument("--adapter-b", default=None)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--json", default=None)
    p.add_argument("--log-dir", default="/tmp/bench-adapters")
    return p.parse_args(argv)


def adapters(args: argparse.Namespace) -> tuple[str, str]:
    if args.adapter_a and args.adapter_b:
        return args.adapter_a, args.adapter_b
    sys.path.insert(0, str(REPO_ROOT))
    from tests.lora_fixture import trained_adapter

    return str(trained_adapter()), str(
        trained_adapter("b", phrase="The lighthouse password is amber heron 3.")
    )


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and its descendants (the engine processes)."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            fields = Path(f"/proc/{p}/status").read_text().split("\n")
        except OSError:
            continue
        total += next((int(f.split()[1]) * 1024 for f in fields if f.startswith("VmRSS:")), 0)
    return total


def tokens(level: LevelResult) -> tuple[int, int]:
    done = [r for r in level.records if r.error is None]
    return sum(r.completion_tokens or 0 for r in done), len(level.records) - len(done)


async def one_batch(url: str, args: argparse.Namespace, tokenizer: Any, first: int) -> dict[str, float]:
    spec = LoadSpec(
        args.clients,
        args.clients,
        args.max_tokens,
        first,
        f"{NAME}:a",
        lambda i: build_prompt(i, None, tokenizer),
    )
    level = await run_level(url, spec)
    n, failed = tokens(level)
    return {"tok_s": n / level.wall_s, "tokens": n, "failed": failed, "wall_s": level.wall_s}


async def two_engines(url: str, args: argparse.Namespace, tokenizer: Any, first: int) -> dict[str, float]:
    half = args.clients // 2
    specs = [
        LoadSpec(
            half,
            half,
            args.max_tokens,
            first + k * half,
            f"{NAME}:{name}",
            lambda i: build_prompt(i, None, tokenizer),
        )
        for k, name in enumerate("ab")
    ]
    start = time.perf_counter()
    levels = await asyncio.gather(*(run_level(url, s) for s in specs))
    wall = time.perf_counter() - start
    counts = [tokens(level) for level in levels]
    n = sum(c[0] for c in counts)
    return {"tok_s": n / wall, "tokens": n, "failed": sum(c[1] for c in counts), "wall_s": wall}


async def warm(url: str, model: str) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    async with httpx.AsyncClient(timeout=600) as client:
        r = await client.post(url + "/v1/chat/completions", json=body)
        r.raise_for_status()


async def served(args: argparse.Namespace, base: Path, pair: tuple[str, str]) -> dict[str, Any]:
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    extra = ["--served-model-name", NAME, "--adapter", f"a={pair[0]}", "--adapter", f"b={pair[1]}"]
    spec = ServerSpec("mlx-serve", base, extra, dict(os.environ), REPO_ROOT)
    server = start_server(spec, logs / "mlx-serve.log")
    tokenizer = load_tokenizer(base)
    out: dict[str, Any] = {"one_batch": [], "two_engines": []}
    try:
        await wait_healthy(server, 600)
        await warm(server.base_url, f"{NAME}:a")
        out["rss_one_engine"] = rss_bytes(server.process.pid)
        await warm(server.base_url, f"{NAME}:b")
        out["rss_two_engines"] = rss_bytes(server.process.pid)
        for r in range(args.rounds):
            order = ["one_batch", "two_engines"] if r % 2 == 0 else ["two_engines", "one_batch"]
            for kind in order:
                run = one_batch if kind == "one_batch" else two_engines
                out[kind].append(await run(server.base_url, args, tokenizer, 1000 * r))
    finally:
        stop_server(server)
    return out


def decode_steps(base: Path, adapter: str, batches: list[int], steps: int = 60) -> dict[str, float]:
    """mlx-lm's batched decode step (fastest and median seconds) with and without the adapter's LoRA layers,
    the two timed in turn step by step so that both see the same machine."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from mlx_serve.engine.model.loader import maybe_dequantize

    models = {
        label: maybe_dequantize(load(str(base), adapter_path=path)[0])
        for label, path in (("base", None), ("lora", adapter))
    }
    out: dict[str, float] = {}
    for b in batches:
        caches = {label: make_prompt_cache(model) for label, model in models.items()}
        for label, model in models.items():
            mx.eval(model(mx.zeros((b, 64), dtype=mx.int32), cache=caches[label]))
        times: dict[str, list[float]] = {label: [] for label in models}
        y = mx.zeros((b, 1), dtype=mx.int32)
        for _ in range(steps):
            for label, model in models.items():
                t = time.perf_counter()
                mx.eval(model(y, cache=caches[label]))
                times[label].append(time.perf_counter() - t)
        # The fastest step: on a shared machine other work only ever adds to a step's time.
        out.update({f"{label}@{b}": min(ts[2:]) for label, ts in times.items()})
        out.update({f"{label}@{b} median": statistics.median(ts[2:]) for label, ts in times.items()})
    return out


def report(
    m: machine.Machine, args: argparse.Namespace, res: dict[str, Any], steps: dict[str, float]
) -> None:
    print(m.line())
    one = statistics.median(r["tok_s"] for r in res["one_batch"])
    two = statistics.median(r["tok_s"] for r in res["two_engines"])
    failed = sum(r["failed"] for k in ("one_batch", "two_engines") for r in res[k])
    c, half = args.clients, args.clients // 2
    print(f"clients {c}, max_tokens {args.max_tokens}, rounds {args.rounds}, failed {failed}")
    print(
        f"one adapter, one batch of {c}:      {one:7.1f} tok/s (rounds {[round(r['tok_s'], 1) for r in res['one_batch']]})"
    )
    print(
        f"two adapters, two engines of {half}:   {two:7.1f} tok/s (rounds {[round(r['tok_s'], 1) for r in res['two_engines']]})"
    )
    print(f"ratio two engines / one batch: {two / one:.2f}")
    mib = 1 << 20
    print(
        f"server RSS: one adapter engine {res['rss_one_engine'] / mib:.0f} MiB, two {res['rss_two_engines'] / mib:.0f} MiB"
    )
    for b in sorted({int(k.split("@")[1].split()[0]) for k in steps}):
        base, lora = steps[f"base@{b}"], steps[f"lora@{b}"]
        print(
            f"decode step (fastest of 58) at batch {b:2d}: base {base * 1e3:6.1f} ms, with LoRA {lora * 1e3:6.1f} ms"
            f" ({lora / base:.2f}x; {lora * 1e3 / b:.1f} ms a row)"
        )
    print(
        f"a batch of {c} against two of {half}: {steps[f'lora@{c}'] / (2 * steps[f'lora@{half}']):.2f}x the time"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    base = model_folder(args.model)
    pair = adapters(args)
    m = machine.describe()
    res = asyncio.run(served(args, base, pair))
    steps = decode_steps(base, pair[0], sorted({1, args.clients // 2, args.clients, 2 * args.clients}))
    report(m, args, res, steps)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": m.line(), "served": res, "steps": steps}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
