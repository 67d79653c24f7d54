"""startup: launch → first answer, mlx-serve vs mlx_lm.server in alternating rounds.

Each round starts each server (the order alternates) and sends a one-token chat request every
50 ms until one answers 200; the time from launch to that answer is the server's start-up. The
first round also compiles what either server compiles on first use (kernels, the template) and
is reported like the rest: the medians leave it out only when there are three rounds or more.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import asdict
from typing import Any

import httpx

from bench.common import REQUEST_MODEL, log_dir, model_folder, server_names, server_spec
from bench.machine import describe
from bench.report import fmt, ratio
from bench.servers import RunningServer, ServerStartError, log_tail, start_server, stop_server

DEFAULTS = {"rounds": 5}
POLL_S = 0.05


def add_arguments(p: argparse.ArgumentParser) -> None:
    del p  # the common flags are all it takes


def first_answer(server: RunningServer, timeout_s: float) -> float:
    """The clock when a one-token chat request first answers 200 (polled every POLL_S)."""
    body = {"model": REQUEST_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    deadline = time.perf_counter() + timeout_s
    with httpx.Client(timeout=timeout_s) as client:
        while time.perf_counter() < deadline:
            if server.process.poll() is not None:
                raise ServerStartError(f"exited: {log_tail(server.log_path)}")
            try:
                if client.post(server.base_url + "/v1/chat/completions", json=body).status_code == 200:
                    return time.perf_counter()
            except httpx.HTTPError:
                pass
            time.sleep(POLL_S)
    raise ServerStartError(f"no answer after {timeout_s:.0f} s: {log_tail(server.log_path)}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = model_folder(args.model)
    names, logs = server_names(args), log_dir(args, "startup")
    times: dict[str, list[float]] = {n: [] for n in names}
    for number in range(args.rounds):
        for name in names if number % 2 == 0 else names[::-1]:
            began = time.perf_counter()
            server = start_server(server_spec(args, name, model, logs), logs / f"{name}-{number + 1}.log")
            try:
                times[name].append(first_answer(server, args.startup_timeout) - began)
            finally:
                stop_server(server)
            print(f"  round {number + 1} {name}: {times[name][-1]:.2f} s", flush=True)
    machine = describe()
    print(f"\n{machine.line()}\nmodel {model}; launch -> first answer, {args.rounds} alternating rounds")
    kept = {n: ts[1:] if len(ts) >= 3 else ts for n, ts in times.items()}
    for name, ts in times.items():
        print(
            f"  {name:<10} median {statistics.median(kept[name]):.2f} s  all: {', '.join(f'{t:.2f}' for t in ts)}"
        )
    if len(names) == 2:
        r = ratio(statistics.median(kept[names[0]]), statistics.median(kept[names[1]]))
        print(f"  {names[0]} / {names[1]}: {fmt(r, 2)}x (lower is better)", flush=True)
    return {"machine": asdict(machine), "seconds": times}
