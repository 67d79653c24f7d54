"""models: one server, two models: resident memory with 0, 1 and 2 loaded, and load-on-demand latency.

mlx-serve runs `--model FIRST --model second=SECOND` (SECOND: by default FIRST's folder under
another path, so both servers see two models); each round unloads both (POST
/models/unload), then a streaming chat names FIRST, then SECOND: the time to the response's first
byte (mlx-serve sends the SSE head while the model loads), to the first token, and the server's
resident memory (its process and its engine processes) after each step. mlx_lm.server, the
reference, holds one model: a request naming SECOND while it holds FIRST swaps it in, so its
numbers are that swap's first token and its memory with one model loaded.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench.common import log_dir, model_folder, server_names, server_spec
from bench.machine import describe
from bench.report import fmt, ratio
from bench.servers import RunningServer, descendants, start_server, stop_server

DEFAULTS = {"rounds": 2, "max_tokens": 8}
PAGE = 4096
TOKEN = re.compile(rb'"content": ?"[^"]')  # a delta with text (mlx_lm.server spaces its JSON)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--second", default=None, help="the second model's folder (default: the first, linked elsewhere)"
    )


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and every process under it."""
    total = 0
    for p in descendants(pid):
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
        except (OSError, IndexError, ValueError):
            continue
    return total


def first_byte_and_token(url: str, model: str, max_tokens: int) -> tuple[float, float]:
    """Seconds to the response's first byte and to its first token, for a streaming chat."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": max_tokens}
    began = time.perf_counter()
    first_byte = first_token = 0.0
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=900) as r:
        for chunk in r.iter_raw():
            now = time.perf_counter() - began
            first_byte = first_byte or now
            if TOKEN.search(chunk) and not first_token:
                first_token = now
    if r.status_code != 200 or not first_token:
        raise RuntimeError(f"{model}: no token ({r.status_code})")
    return first_byte, first_token


def wait_for(predicate: Any, timeout_s: float) -> None:
    deadline = time.perf_counter() + timeout_s
    while not predicate():
        if time.perf_counter() > deadline:
            raise RuntimeError("condition not reached in time")
        time.sleep(0.1)


def states(server: RunningServer) -> dict[str, str]:
    data = httpx.get(server.base_url + "/models", timeout=10).json()["data"]
    return {m["id"]: m["status"]["value"] for m in data}


def mlx_serve_round(server: RunningServer, names: list[str], max_tokens: int) -> dict[str, Any]:
    pid, out = server.process.pid, {}
    for name in names:
        httpx.post(server.base_url + "/models/unload", json={"model": name}, timeout=60)
    wait_for(lambda: len(descendants(pid)) <= 2, 60)  # the engines are gone (a resource tracker may stay)
    out["rss_0"] = rss_bytes(pid)
    for i, name in enumerate(names, start=1):
        out[f"first_byte_{i}"], out[f"first_token_{i}"] = first_byte_and_token(
            server.base_url, name, max_tokens
        )
        out[f"rss_{i}"] = rss_bytes(pid)
    return out


def mlx_lm_round(server: RunningServer, models: list[Path], max_tokens: int) -> dict[str, Any]:
    first_byte_and_token(server.base_url, str(models[0]), max_tokens)  # it holds FIRST
    byte, token = first_byte_and_token(server.base_url, str(models[1]), max_tokens)  # swaps SECOND in
    return {"first_byte_2": byte, "first_token_2": token, "rss_1": rss_bytes(server.process.pid)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    first = model_folder(args.model)
    logs, results = log_dir(args, "models"), {}
    second = model_folder(args.second) if args.second else logs / "second-model"
    if not args.second and not second.exists():  # the same weights at another path: mlx_lm swaps
        second.symlink_to(first, target_is_directory=True)
    for name in server_names(args):
        rounds = []
        for number in range(args.rounds):
            extra = f"--model second={second}" if name == "mlx-serve" else ""
            spec = server_spec(args, name, first, logs, extra)
            server = start_server(spec, logs / f"{name}-{number + 1}.log")
            try:
                rounds.append(_round(name, server, first, second, args))
            finally:
                stop_server(server)
            print(f"  round {number + 1} {name}: {_line(rounds[-1])}", flush=True)
        results[name] = rounds
    machine = describe()
    print(f"\n{machine.line()}\nfirst {first}; second {second}; medians of {args.rounds} rounds")
    medians = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in results.items()}
    for name, m in medians.items():
        print(f"  {name:<10} {_line(m)}")
    if len(medians) == 2 and "first_token_2" in medians.get("mlx_lm", {}):
        r = ratio(medians["mlx-serve"]["first_token_2"], medians["mlx_lm"]["first_token_2"])
        print(f"  second model's first token, mlx-serve / mlx_lm: {fmt(r, 2)}x (lower is better)")
    return {"machine": asdict(machine), "rounds": results}


def _round(
    name: str, server: RunningServer, first: Path, second: Path, args: argparse.Namespace
) -> dict[str, Any]:
    deadline = args.startup_timeout
    if name == "mlx-serve":
        wait_for(lambda: _answers(server) and "loaded" in states(server).values(), deadline)
        return mlx_serve_round(server, list(states(server)), args.max_tokens)
    wait_for(lambda: _answers(server), deadline)
    return mlx_lm_round(server, [first, second], args.max_tokens)


def _answers(server: RunningServer) -> bool:
    try:
        return httpx.get(server.base_url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _line(m: dict[str, Any]) -> str:
    parts = [f"{k.replace('_', ' ')} {v / 2**20:.0f} MiB" for k, v in m.items() if k.startswith("rss")]
    parts += [f"{k.replace('_', ' ')} {v:.2f} s" for k, v in m.items() if k.startswith("first")]
    return "; ".join(parts)
