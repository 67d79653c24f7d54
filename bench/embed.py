"""embed: embeddings throughput, mlx-serve's POST /v1/embeddings beside the same model called
directly (engine.encoder in this process, no HTTP), in inputs per second.

The direct reference embeds the whole set in calls of --batch inputs, one after another. Over
HTTP each client sends calls of --batch inputs until the set is done; then 16 clients send one
input a call, which only batching by arrival turns into shared forwards. Ratios are ours over
direct, measured in one run on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

DEFAULTS = {"rounds": 3, "clients": "1,4"}
DEFAULT_MODEL = "all-minilm-l6-v2"
SUBJECTS = ("the harbour", "a quiet library", "the night train", "an old orchard", "the city council")
VERBS = ("reopened after", "was described in", "changed little during", "grew quickly through", "survived")
OBJECTS = ("a long winter", "the census of 1901", "three wet summers", "the new bridge's first year")


def texts(n: int, words: int) -> list[str]:
    """n distinct sentences of about `words` words (a document chunk's size by default)."""
    out = []
    for i in range(n):
        clause = f"{SUBJECTS[i % 5]} {VERBS[i // 5 % 5]} {OBJECTS[i // 25 % 4]}, record {i}."
        out.append(" ".join((clause.split() * (words // len(clause.split()) + 1))[:words]))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--inputs", type=int, default=256, help="texts embedded per measurement (256)")
    p.add_argument("--words", type=int, default=48, help="words per text (48: ~60 tokens)")
    p.add_argument("--batch", type=int, default=32, help="inputs per call (32)")


def direct_rate(model_name: str, items: list[str], batch: int, rounds: int) -> float:
    """Inputs per second through engine.encoder in this process: tokenize, forward, pool."""
    from mlx_serve.engine.encoder.loader import load_encoder
    from mlx_serve.engine.encoder.pooling import finish
    from mlx_serve.engine.encoder.runner import pooled

    model = load_encoder(model_name)

    def once() -> float:
        start = time.perf_counter()
        for i in range(0, len(items), batch):
            finish(pooled(model, model.rows(items[i : i + batch])), model.dimensions, None)
        return len(items) / (time.perf_counter() - start)

    once()  # warm: kernels, allocator
    return sorted(once() for _ in range(rounds))[rounds // 2]


def http_rate(url: str, items: list[str], batch: int, clients: int) -> float:
    """Inputs per second over HTTP with `clients` callers sharing the set, `batch` inputs a call."""
    calls = [items[i : i + batch] for i in range(0, len(items), batch)]

    def call(chunk: list[str]) -> None:
        r = httpx.post(
            url + "/v1/embeddings", json={"input": chunk, "encoding_format": "base64"}, timeout=600
        )
        r.raise_for_status()

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(call, calls))
    return len(items) / (time.perf_counter() - start)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from bench.common import log_dir, server_spec, serving
    from bench.machine import describe

    model = args.model or DEFAULT_MODEL
    items = texts(args.inputs, args.words)
    print(describe().line(), flush=True)
    direct = direct_rate(model, items, args.batch, args.rounds)
    print(f"direct engine.encoder, {args.batch} a call: {direct:.1f} inputs/s", flush=True)
    result: dict[str, Any] = {"model": model, "direct_inputs_per_s": direct, "served": []}
    logs = log_dir(args, "embed")

    async def served() -> None:
        spec = server_spec(args, "mlx-serve", Path(model), logs)
        async with serving(spec, logs / "mlx-serve.log", args.startup_timeout) as server:
            http_rate(server.base_url, items[: args.batch], args.batch, 1)  # warm
            plans = [(c, args.batch) for c in _clients(args)] + [(16, 1)]
            for clients, batch in plans:
                rates = [http_rate(server.base_url, items, batch, clients) for _ in range(args.rounds)]
                rate = sorted(rates)[len(rates) // 2]
                result["served"].append({"clients": clients, "batch": batch, "inputs_per_s": rate})
                print(
                    f"mlx-serve /v1/embeddings, {clients} clients x {batch} a call: {rate:.1f} inputs/s "
                    f"= {rate / direct:.2f}x direct",
                    flush=True,
                )

    asyncio.run(served())
    return result


def _clients(args: argparse.Namespace) -> list[int]:
    return list(dict.fromkeys(int(c) for c in str(args.clients).split(",") if c.strip()))


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.embed [flags]` until the suite lists it as `python -m bench embed`."""
    from bench.common import add_common

    p = argparse.ArgumentParser(prog="python -m bench.embed", description=__doc__)
    add_common(p, **DEFAULTS)  # type: ignore[arg-type]
    add_arguments(p)
    args = p.parse_args(argv)
    _on_openblas(args, sys.argv[1:] if argv is None else argv)
    run(args)
    return 0


def _on_openblas(args: argparse.Namespace, argv: list[str]) -> None:
    """As bench.common.reexec_with_openblas, for this module run on its own."""
    import os

    from bench.common import BLAS_MARK
    from mlx_serve.engine.model.blas import find_openblas

    lib = find_openblas() if sys.platform.startswith("linux") and not args.bundled_blas else None
    if lib is None or os.environ.get(BLAS_MARK) or lib in os.environ.get("LD_PRELOAD", ""):
        return
    env = {**os.environ, "LD_PRELOAD": ":".join(p for p in (lib, os.environ.get("LD_PRELOAD", "")) if p)}
    os.execve(sys.executable, [sys.executable, "-m", "bench.embed", *argv], {**env, BLAS_MARK: "1"})


if __name__ == "__main__":
    sys.exit(main())
