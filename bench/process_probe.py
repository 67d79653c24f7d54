"""Why one stream decodes slower in a child process (issue 19 item 1; H200 session 14: mlx-lm's own
`stream_generate` ran 0.92x as fast in a spawned process as in the bench's main one).

    python -m bench.process_probe --model DIR [--tokens 256] [--rounds 10]
        [--arms 'main,spawn,spawn 2,popen,main thread'] [--main-load first|last] [--verbose]

The same greedy `stream_generate` (one prompt, `--tokens` new tokens) in several processes, each
with a model of its own, one at a time, interleaved round by round:

  main         this process (it loads its model before the children start, or after with
               `--main-load last`; with no `main*` arm it loads none)
  main thread  this process, on a second thread (the main one waits)
  spawn        a multiprocessing "spawn" child (as the server starts its engine process)
  spawn 2      a second one
  popen        a fresh interpreter started with subprocess.Popen (not multiprocessing)

Per arm: the decode rate, the generating thread's CPU time a token (`time.thread_time`) and the
whole process's (all its threads), against wall time a token, and the CPUs the thread ran on. A
slower arm whose thread spends the same CPU time a token waits on something else (the GPU, the
driver); one whose CPU time grew runs slower on the host. Ratios are per round to the first arm,
bracketed as in bench.stream_contexts.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Client, Listener
from typing import Any

from bench.single_stream import MESSAGES, rate_line
from bench.speculation import load_as_served


def cpu_now() -> int:
    """The CPU this thread last ran on (field 39 of /proc/thread-self/stat)."""
    with open("/proc/thread-self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[36])


def measure(
    model: Any, tokenizer: Any, prompt: list[int], n: int
) -> tuple[float, float, float, float, set[int]]:
    """(rate, wall us/token, thread CPU us/token, process CPU us/token, CPUs seen)."""
    from mlx_lm.generate import stream_generate

    stamps: list[tuple[float, float, float]] = []
    cpus: set[int] = set()
    for i, _ in enumerate(stream_generate(model, tokenizer, prompt, max_tokens=n)):
        stamps.append((time.perf_counter(), time.thread_time(), time.process_time()))
        if i % 32 == 0:
            cpus.add(cpu_now())
    (w0, t0, p0), (w1, t1, p1) = stamps[0], stamps[-1]
    k = len(stamps) - 1
    return k / (w1 - w0), 1e6 * (w1 - w0) / k, 1e6 * (t1 - t0) / k, 1e6 * (p1 - p0) / k, cpus


def serve(conn: Any, path: str) -> None:
    """A child's loop: load, say where it runs, then measure on each request until None."""
    model, tokenizer = load_as_served(path)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    conn.send(describe())
    while (n := conn.recv()) is not None:
        conn.send(measure(model, tokenizer, prompt, n))


def serve_at(address: str, path: str) -> None:
    serve(Client(address), path)


def describe() -> str:
    return (
        f"pid {os.getpid()} affinity {len(os.sched_getaffinity(0))} CPUs nice {os.nice(0)} "
        f"threads {len(os.listdir('/proc/self/task'))} parent {os.getppid()}"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--arms", default="main,spawn,spawn 2,popen,main thread")
    p.add_argument("--main-load", choices=("first", "last"), default="first")
    p.add_argument("--verbose", action="store_true", help="a line per run")
    args = p.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    here: dict[str, Any] = {}

    def load_here() -> None:
        here["model"], here["tokenizer"] = load_as_served(args.model)
        here["prompt"] = here["tokenizer"].apply_chat_template(MESSAGES, add_generation_prompt=True)

    wants_main = any(a.startswith("main") for a in arms)
    if wants_main and args.main_load == "first":
        load_here()
    conns: dict[str, Any] = {}
    procs: list[Any] = []
    ctx = mp.get_context("spawn")
    for arm in arms:
        if arm.startswith("spawn"):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=serve, args=(theirs, args.model), daemon=True)
            proc.start()
            procs.append(proc)
            conns[arm] = ours
        elif arm == "popen":
            address = os.path.join(tempfile.mkdtemp(prefix="process-probe-"), "sock")
            listener = Listener(address)
            code = f"from bench.process_probe import serve_at; serve_at({address!r}, {args.model!r})"
            procs.append(subprocess.Popen([sys.executable, "-c", code]))
            conns[arm] = listener.accept()
    print(f"main: {describe()}", flush=True)
    for arm, conn in conns.items():
        print(f"{arm}: {conn.recv()}", flush=True)
    if wants_main and args.main_load == "last":
        load_here()

    def run(arm: str) -> tuple[float, float, float, float, set[int]]:
        if arm == "main":
            return measure(here["model"], here["tokenizer"], here["prompt"], args.tokens)
        if arm == "main thread":
            got: list[Any] = []
            t = threading.Thread(
                target=lambda: got.append(
                    measure(here["model"], here["tokenizer"], here["prompt"], args.tokens)
                )
            )
            t.start()
            t.join()
            return got[0]
        conns[arm].send(args.tokens)
        return conns[arm].recv()  # type: ignore[no-any-return]

    results: dict[str, list[tuple[float, float, float, float, set[int]]]] = {a: [] for a in arms}
    for r in range(args.rounds + 2):  # two warm-up rounds
        for arm in arms:
            got = run(arm)
            if r >= 2:
                results[arm].append(got)
            if args.verbose:
                print(
                    f"    round {r} {arm:<11} {got[0]:6.1f} tok/s  wall {got[1]:5.0f} us  thread CPU {got[2]:5.0f} us  "
                    f"process CPU {got[3]:5.0f} us  CPUs {sorted(got[4])}",
                    flush=True,
                )
    closing = run(arms[0])[0]
    for conn in conns.values():
        conn.send(None)
    for proc in procs:
        proc.join(30) if hasattr(proc, "join") else proc.wait(30)
    print(
        f"model {args.model}  {args.tokens} tokens  {args.rounds} rounds, interleaved  main loaded {args.main_load}"
    )
    ref = [x[0] for x in results[arms[0]]] + [closing]
    bracket = [(a + b) / 2 for a, b in itertools.pairwise(ref)]
    for arm, xs in results.items():
        rs = [x[0] for x in xs]
        print(rate_line(arm, rs, rs if arm == arms[0] else bracket, 12), flush=True)
        med = [statistics.median(x[i] for x in xs) for i in (1, 2, 3)]
        cpus = sorted(set().union(*(x[4] for x in xs)))
        print(
            f"      per token: wall {med[0]:.0f} us, thread CPU {med[1]:.0f} us, process CPU {med[2]:.0f} us; "
            f"CPUs seen {cpus}",
            flush=True,
        )


if __name__ == "__main__":
    main()
