"""Does where a process runs on the host move one stream's decode? (issue 19 item 1)

    python -m bench.placement --model DIR [--tokens 256] [--rounds 5]

One stream's decode on an accelerator is bound by the host thread that builds and launches each
step's kernels, so the same code can run at different speeds depending on the CPU it lands on
and on what else runs on that CPU's core. Every round runs each condition once, back to back:

  direct            stream_generate in this process, unpinned
  direct pinned     the same, every thread of this process pinned to one CPU (P)
  direct +2 busy    pinned to P while two busy loops run on two other cores
  direct +sibling   pinned to P while a busy loop runs on P's SMT sibling (when the host has SMT)
  served            one streaming request to mlx-serve, nothing pinned
  served pinned     the engine process pinned to P, the server process and this client each to
                    CPUs of other cores

For served requests both clocks are printed: the client's (first chunk to last) and the
engine's (its --trace: first token to finish). Linux only (sched_setaffinity, /proc).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from mlx_lm.generate import stream_generate

from bench.servers import ServerSpec, server_cwd, start_server, stop_server
from bench.single_stream import MESSAGES, is_text_chunk, rate, rate_line
from bench.speculation import load_as_served


def topology() -> dict[int, tuple[int, int]]:
    """CPU -> (core, node) for the CPUs this process may use."""
    allowed = os.sched_getaffinity(0)
    out = subprocess.run(["lscpu", "-p=CPU,CORE,NODE"], capture_output=True, text=True, check=True).stdout
    cpus: dict[int, tuple[int, int]] = {}
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        cpu, core, node = (int(x or 0) for x in line.split(","))
        if cpu in allowed:
            cpus[cpu] = (core, node)
    return cpus


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto `cpus`."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), cpus)


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], check=False, capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def busy(cpu: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"])


def served_once(client: httpx.Client, url: str, n: int) -> float:
    body = {"model": "default_model", "messages": MESSAGES, "max_tokens": n, "temperature": 0, "stream": True}
    times: list[float] = []
    with client.stream(
        "POST", url, content=orjson.dumps(body), headers={"content-type": "application/json"}
    ) as r:
        for line in r.iter_lines():
            if is_text_chunk(line):
                times.append(time.perf_counter())
    return rate(times)


def main(args: argparse.Namespace) -> None:
    cpus = topology()
    cores: dict[int, list[int]] = {}
    for cpu, (core, _node) in sorted(cpus.items()):
        cores.setdefault(core, []).append(cpu)
    order = [c for c in cores if c != 0] + [0]  # leave core 0 (interrupts) for last
    p_core, others = order[0], order[1:]
    P = cores[p_core][0]
    sibling = cores[p_core][1] if len(cores[p_core]) > 1 else None
    busy_cpus = [cores[c][0] for c in others[:2]]
    all_cpus = set(cpus)
    rest = (all_cpus - {P}) or all_cpus  # a small host: the server and client share what is left
    server_cpus = {x for c in others[2:5] for x in cores[c]} or rest
    client_cpus = {x for c in others[5:7] for x in cores[c]} or rest
    print(
        f"cpus {len(cpus)} cores {len(cores)} nodes {len({n for _, n in cpus.values()})}; "
        f"P={P} sibling={sibling} busy={busy_cpus} server={sorted(server_cpus)} client={sorted(client_cpus)}"
    )

    model, tokenizer = load_as_served(args.model)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    me = os.getpid()

    def direct() -> float:
        return rate(
            [time.perf_counter() for _ in stream_generate(model, tokenizer, prompt, max_tokens=args.tokens)]
        )

    log_dir = Path(tempfile.mkdtemp(prefix="placement-"))
    trace = log_dir / "trace.jsonl"
    spec = ServerSpec(
        "mlx-serve",
        Path(args.model),
        ["--trace", str(trace)],
        dict(os.environ),
        server_cwd("mlx-serve", log_dir),
    )
    server = start_server(spec, log_dir / "server.log")
    try:
        url = server.base_url + "/v1/chat/completions"
        with httpx.Client(timeout=900) as client:
            deadline = time.monotonic() + 900
            while True:
                try:
                    if client.get(server.base_url + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("server did not become healthy")
                time.sleep(0.5)
            engine_pids = [p for c in children(server.process.pid) for p in [c, *children(c)]]

            def unpin_all() -> None:
                pin(me, all_cpus)
                pin(server.process.pid, all_cpus)
                for p in engine_pids:
                    pin(p, all_cpus)

            def served() -> float:
                unpin_all()
                return served_once(client, url, args.tokens)

            def served_pinned() -> float:
                pin(me, client_cpus)
                pin(server.process.pid, server_cpus)
                for p in engine_pids:
                    pin(p, {P})
                try:
                    return served_once(client, url, args.tokens)
                finally:
                    unpin_all()

            def direct_pinned(extra: list[int]) -> float:
                pin(me, {P})
                loops = [busy(c) for c in extra]
                time.sleep(0.2)
                try:
                    return direct()
                finally:
                    for b in loops:
                        b.kill()
                        b.wait()
                    pin(me, all_cpus)

            conds = {
                "direct": direct,
                "direct pinned": lambda: direct_pinned([]),
                "direct +2 busy": lambda: direct_pinned(busy_cpus),
                **({"direct +sibling": lambda: direct_pinned([sibling])} if sibling is not None else {}),
                "served": served,
                "served pinned": served_pinned,
            }
            for _ in range(2):  # warm-up
                for fn in conds.values():
                    fn()
            rates: dict[str, list[float]] = {k: [] for k in conds}
            served_order: list[str] = []
            for _ in range(args.rounds):
                for name, fn in conds.items():
                    rates[name].append(fn())
                    if name.startswith("served"):
                        served_order.append(name)
    finally:
        stop_server(server)
    lines = [orjson.loads(x) for x in trace.read_text().splitlines()]
    engine_rates: dict[str, list[float]] = {"served": [], "served pinned": []}
    for name, line in zip(served_order, lines[-len(served_order) :], strict=True):
        e = line["engine_s"][0]
        engine_rates[name].append((args.tokens - 1) / (e["finished"] - e["first_token"]))
    print(f"model {args.model}  {args.tokens} tokens  {args.rounds} rounds, interleaved")
    for name, rs in rates.items():
        line = rate_line(name, rs, rates["direct"], 16)
        if name in engine_rates:
            line += f"  engine clock {statistics.median(engine_rates[name]):.1f} tok/s"
        print(line, flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    main(p.parse_args())
