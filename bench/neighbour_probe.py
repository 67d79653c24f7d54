"""Whether work on the host's other CPUs slows one stream's decoding thread (issue 19 item 1).

    python -m bench.neighbour_probe --model DIR [--pin CPU] [--tokens 256] [--rounds 10]
        [--arms 'quiet,spin,wake'] [--neighbours N]

A served stream's engine thread shares the host with the server process and the client, each
busy on other CPUs for every token (the server ~0.2-0.6 ms of CPU a chunk: bench.server_cpu).
This measures what such neighbours cost a decoding thread that has a CPU to itself: mlx-lm's
`stream_generate` in a spawned worker whose main thread is pinned to `--pin`, while neighbour
processes on the other CPUs are paused (SIGSTOP) or running, round by round:

  quiet  every neighbour paused
  spin   `--neighbours` processes, one a CPU, each in a pure-Python busy loop (compute only)
  wake   as many processes in pairs, each pair passing a byte back and forth over a socket
         pair as fast as it can (wake-ups, system calls and context switches, like a server's
         and a client's I/O)

Ratios are per round to `quiet`, bracketed as in bench.stream_contexts. A ratio below 1 is a
slowdown the engine thread suffers from its neighbours alone (shared caches, memory bandwidth,
the hypervisor's scheduling of sibling vCPUs), which no change to the engine's own code removes.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import signal
import socket
import statistics
from typing import Any

from bench.single_stream import MESSAGES, rate_line
from bench.speculation import load_as_served
from bench.stream_contexts import direct_rate


def worker(conn: Any, path: str, pin: int) -> None:
    model, tokenizer = load_as_served(path)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    os.sched_setaffinity(0, {pin})  # this thread only: MLX's own threads keep theirs
    conn.send("ready")
    while (n := conn.recv()) is not None:
        conn.send(direct_rate(model, tokenizer, prompt, n))


def spin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    x = 0
    while True:
        x = (x * 31 + 7) % 1000003


def wake(cpu: int, sock: socket.socket, first: bool) -> None:
    os.sched_setaffinity(0, {cpu})
    if first:
        sock.send(b"x")
    while True:
        sock.send(sock.recv(1))


def start_neighbours(kind: str, cpus: list[int]) -> list[Any]:
    ctx = mp.get_context("fork")
    procs: list[Any] = []
    if kind == "spin":
        procs = [ctx.Process(target=spin, args=(c,), daemon=True) for c in cpus]
    else:
        pairs = list(zip(cpus[0::2], cpus[1::2])) or [(cpus[0], cpus[0])]  # one CPU: both on it
        for a, b in pairs:
            left, right = socket.socketpair()
            procs += [
                ctx.Process(target=wake, args=(a, left, True), daemon=True),
                ctx.Process(target=wake, args=(b, right, False), daemon=True),
            ]
    for p in procs:
        p.start()
        os.kill(p.pid, signal.SIGSTOP)
    return procs


def signal_all(procs: list[Any], sig: int) -> None:
    for p in procs:
        os.kill(p.pid, sig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--pin", type=int, default=1)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--arms", default="quiet,spin,wake")
    p.add_argument("--neighbours", type=int, default=0, help="how many (default: every other CPU)")
    args = p.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    assert arms[0] == "quiet", "the first arm is the reference: quiet"
    others = sorted(os.sched_getaffinity(0) - {args.pin})
    cpus = others[: args.neighbours or len(others)]
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=worker, args=(theirs, args.model, args.pin), daemon=True)
    proc.start()
    assert ours.recv() == "ready"
    os.sched_setaffinity(0, set(others) or {args.pin})  # this process keeps off the pinned CPU
    neighbours = {arm: start_neighbours(arm, cpus) for arm in arms if arm != "quiet"}

    def run(arm: str) -> float:
        signal_all(neighbours.get(arm, []), signal.SIGCONT)
        try:
            ours.send(args.tokens)
            return float(ours.recv())
        finally:
            signal_all(neighbours.get(arm, []), signal.SIGSTOP)

    rates: dict[str, list[float]] = {a: [] for a in arms}
    for r in range(args.rounds + 2):  # two warm-up rounds
        for arm in arms:
            got = run(arm)
            if r >= 2:
                rates[arm].append(got)
    closing = run("quiet")
    ours.send(None)
    for procs in neighbours.values():
        signal_all(procs, signal.SIGKILL)
    print(
        f"model {args.model}  {args.tokens} tokens  {args.rounds} rounds, interleaved; decoding thread on CPU "
        f"{args.pin}, {len(cpus)} neighbour processes on CPUs {','.join(map(str, cpus))}"
    )
    bracket = [(a + b) / 2 for a, b in itertools.pairwise([*rates["quiet"], closing])]
    for arm, rs in rates.items():
        print(rate_line(arm, rs, rs if arm == "quiet" else bracket, 6), flush=True)
    print(f"  (quiet median {statistics.median(rates['quiet']):.1f} tok/s)")


if __name__ == "__main__":
    main()
