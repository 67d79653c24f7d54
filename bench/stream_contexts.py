"""Which context one stream's decode loses its speed in (issue 19 item 1).

    python -m bench.stream_contexts --model DIR [--tokens 256] [--rounds 5] [--mlx-serve-args '...']
        [--contexts 'direct here,served process,...']

The same greedy request (one prompt, `--tokens` new tokens) in six contexts, each once per round,
back to back, so a drifting host moves them all alike:

  direct here        mlx-lm's stream_generate in this process
  core here          our whole engine core (scheduler, runner, detokenizer, events) in this process
  direct worker      stream_generate in a second, spawned process (a model of its own)
  core worker        our core in that worker
  served core        in that worker, the core the server builds (engine.host.assemble.make_core), kept
  served core framed the same, each step's events also sent as the engine process sends them
                     (a frame on a socket pair) to a process that, like the server, sleeps in
                     `select` until one arrives: the served engine's cost of waking its reader,
                     without the server's and the client's work on the host's other CPUs
  served core framed poll   the same, the reader polling the socket every 1 ms instead of
                     sleeping in `select` (so a send wakes no one)
  served core framed every 4   framed, but the step's events sent every 4th step only
  served core syscall  the same pickle of each step's events, written to /dev/null instead: a
                     system call a step that wakes no one
  served process     mlx-serve over HTTP, engine in its child process (the default)
  served lazy        the same server, a client that reads only once the engine is done
  served thread      mlx-serve over HTTP, `--engine thread`
  served plain       mlx-serve with `--no-warmup --prompt-cache-size 0`
  served parent      mlx-serve from another checkout (`--parent-tree DIR`, e.g. the parent commit's):
                     an A/B of two versions of the server in one run

For the served ones both clocks are printed: the client's (first chunk to last) and the engine's
(its --trace: first token to finish). Ratios are per round to the reference (`--reference`,
`direct here` unless told), bracketed: the reference runs once more after the last round, and a
round's reference is the mean of its run and the next round's, so a host that drifts within a
round moves the reference with it. `--contexts` runs only the named ones (the reference always;
only their servers start). `--reference 'direct worker'` compares processes with processes: the
served engine runs in a child process of its own, and on the H200 `stream_generate` itself ran
0.92x as fast in a spawned process as in the bench's main one (`h200-session14-contexts-1b-workers.txt`;
the CPU it ran on, not the process, bench.process_probe found later); with it, and neither
`direct here` nor `core here` chosen, this process loads no model at all.

`--pin CPU` (Linux) runs every decoding thread on that one CPU (the worker's main thread and each
served engine process's, after they load) and this process, the clients and the servers' other
threads on the other CPUs. On the H200 VMs one 1B stream's decoding thread is busy all the time,
and its speed varies by ~1.7x between vCPUs and over time (`h200-session15-process-probe-1b.txt`):
pinned, the contexts compare on the same CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
from mlx_lm.generate import stream_generate

from bench.report import percentile
from bench.servers import (
    ServerSpec,
    descendants,
    server_cwd,
    start_server,
    stop_server,
    wait_healthy,
    wait_warmed,
)
from bench.single_stream import MESSAGES, is_text_chunk, rate, rate_line
from bench.speculation import load_as_served


def bare_core(model: Any, tokenizer: Any) -> Any:
    """Scheduler, runner and core with their defaults: no prefix cache, no warm-up."""
    from engine.batch.core import Core
    from engine.batch.runner import BatchRunner
    from engine.batch.scheduler import Scheduler, SchedulerConfig
    from engine.types import Counters

    return Core(Scheduler(SchedulerConfig(), frozenset()), BatchRunner(model), tokenizer, Counters())


def served_core(model: Any, tokenizer: Any, path: str) -> Any:
    """The core the server's engine builds (engine.host.assemble.make_core, default settings: memory
    plan, prefix cache, prefill ladder, warm-up before ready; its idle work is dropped)."""
    from engine.host.assemble import make_core
    from engine.host.settings import EngineSettings
    from engine.model.loader import LoadedModel
    from engine.types import Counters

    core = make_core(LoadedModel(model, tokenizer, "m", Path(path)), Counters(), EngineSettings())
    core.idle_work = None
    return core


def core_rate(core: Any, prompt: list[int], n: int) -> float:
    """One request through `core.serve`, timed from its first text event to its last."""
    return rate(core_stamps(core, prompt, n, time.perf_counter))


def core_stamps(
    core: Any,
    prompt: list[int],
    n: int,
    stamp: Callable[[], Any],
    send: Callable[[Any], None] | None = None,
    every: int = 1,
) -> list[Any]:
    """`stamp()` at each text event of one request through `core.serve`; with `send`, each
    step's events also go out as the engine process's child sends them (engine.host.process), or
    every `every`th step's (the steps between then wait in the outbox)."""
    import queue

    from engine.batch.core_parts import Ticket
    from engine.host.process_messages import Events
    from engine.types import Request, SamplingParams, TextDelta

    times: list[Any] = []
    rid = f"r{time.monotonic_ns()}"
    outbox: list[Any] = []

    def emit(ev: Any) -> None:
        if isinstance(ev, TextDelta):
            times.append(stamp())
        if send is not None:
            outbox.append((rid, ev))

    inbox: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
    inbox.put(Ticket(Request(rid, tuple(prompt), SamplingParams(), n), emit))
    done = len(times)
    steps = itertools.count(1)

    def flush() -> None:
        nonlocal done
        due = next(steps) % every == 0 or not core.scheduler.has_work
        if send is not None and outbox and due:
            send(Events(outbox[:]))
            del outbox[:]
        if not core.scheduler.has_work and len(times) > done:
            inbox.put(None)
            done = len(times)

    core.serve(inbox, flush)
    return times


def direct_rate(model: Any, tokenizer: Any, prompt: list[int], n: int) -> float:
    return rate(direct_stamps(model, tokenizer, prompt, n, time.perf_counter))


def direct_stamps(
    model: Any, tokenizer: Any, prompt: list[int], n: int, stamp: Callable[[], Any]
) -> list[Any]:
    """`stamp()` at each token `stream_generate` yields."""
    return [stamp() for _ in stream_generate(model, tokenizer, prompt, max_tokens=n)]


def worker(conn: Any, path: str, pin: int | None = None) -> None:
    model, tokenizer = load_as_served(path)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    as_served = served_core(model, tokenizer, path)
    if pin is not None:  # this thread only: MLX's own threads, started above, keep theirs
        os.sched_setaffinity(0, {pin})
    sends: dict[str, Callable[[Any], None]] = {}
    conn.send("ready")
    while (ask := conn.recv()) is not None:
        what, n = ask
        if what == "direct":
            conn.send(direct_rate(model, tokenizer, prompt, n))
        elif what.startswith("served core framed") or what == "served core syscall":
            if what not in sends:
                sends[what] = timed(
                    null_writer()
                    if what.endswith("syscall")
                    else framed_reader(pin, poll=what.endswith(" poll")),
                    what,
                )
            every = 4 if what.endswith(" every 4") else 1
            conn.send(rate(core_stamps(as_served, prompt, n, time.perf_counter, sends[what], every)))
        else:
            conn.send(
                core_rate(as_served if what == "served core" else bare_core(model, tokenizer), prompt, n)
            )
    for what, took in SEND_US.items():
        print(
            f"  {what}: a step's send took {statistics.median(took):.1f} us median, "
            f"p90 {percentile(took, 90) or 0.0:.1f} us ({len(took)} sends)",
            flush=True,
        )


SEND_US: dict[str, list[float]] = {}  # the worker's sends, timed: printed when it stops


def timed(send: Callable[[Any], None], what: str) -> Callable[[Any], None]:
    took = SEND_US.setdefault(what, [])

    def timed_send(message: Any) -> None:
        t = time.perf_counter()
        send(message)
        took.append(1e6 * (time.perf_counter() - t))

    return timed_send


def null_writer() -> Callable[[Any], None]:
    import pickle

    fd = os.open(os.devnull, os.O_WRONLY)

    def write(message: Any) -> None:
        os.write(fd, pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))

    return write


def framed_reader(pin: int | None = None, poll: bool = False) -> Callable[[Any], None]:
    """A process that reads frames the way the server does (bench.frame_send); its writer's send.
    With `pin` (the caller's thread is pinned there, and a child inherits that), the reader runs on
    every other CPU, as the server does: on the pinned one each wake-up would preempt the decoder
    (it did in the sixteenth session: 0.917x against 0.981x without frames)."""
    import socket
    import subprocess
    import sys

    from engine.host.frames import FrameWriter

    ours, theirs = socket.socketpair()
    drain = "drain_polling" if poll else "drain"
    code = f"import socket, sys; from bench.frame_send import {drain}; {drain}(socket.socket(fileno=int(sys.argv[1])))"
    if pin is not None and (others := set(range(os.cpu_count() or 1)) - {pin}):
        code = f"import os; os.sched_setaffinity(0, {others!r}); {code}"
    # a subprocess, not multiprocessing's: the worker is a daemon process, which may have no children
    subprocess.Popen([sys.executable, "-c", code, str(theirs.fileno())], pass_fds=(theirs.fileno(),))
    theirs.close()
    return FrameWriter(ours.fileno()).send


async def served_once(client: httpx.AsyncClient, n: int, lazy_s: float = 0.0) -> float:
    """The client's decode rate; `lazy_s`: read nothing for that long first (the stream waits in
    the socket buffers, so the client does no work while the engine decodes: the engine's clock
    is then the measure)."""
    body = {"model": "default_model", "messages": MESSAGES, "max_tokens": n, "temperature": 0, "stream": True}
    times: list[float] = []
    async with client.stream(
        "POST",
        "/v1/chat/completions",
        content=orjson.dumps(body),
        headers={"content-type": "application/json"},
    ) as r:
        if lazy_s:
            await asyncio.sleep(lazy_s)
        async for line in r.aiter_lines():
            if is_text_chunk(line):
                times.append(time.perf_counter())
    return rate(times)


async def main(args: argparse.Namespace) -> None:
    ref = args.reference
    chosen = [ref, *(c.strip() for c in args.contexts.split(",") if c.strip() not in ("", ref))]
    model = tokenizer = prompt = None
    if "direct here" in chosen or "core here" in chosen:
        model, tokenizer = load_as_served(args.model)
        prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    if args.pin is not None:  # the decoding threads get CPU `pin`; everything else the others
        os.sched_setaffinity(0, os.sched_getaffinity(0) - {args.pin})
    proc = ctx.Process(target=worker, args=(there, args.model, args.pin), daemon=True)
    if any(c in ("direct worker", "core worker") or c.startswith("served core") for c in chosen):
        proc.start()
        assert here.recv() == "ready"

    def in_worker(what: str) -> float:
        here.send((what, args.tokens))
        return float(here.recv())

    log_dir = Path(tempfile.mkdtemp(prefix="stream-contexts-"))
    extra = args.mlx_serve_args.split()
    servers, clients, traces = {}, {}, {}
    try:
        for name, flags in (
            ("served process", []),
            ("served thread", ["--engine", "thread"]),
            ("served plain", ["--no-warmup", "--prompt-cache-size", "0"]),
            ("served parent", []),
        ):
            if name not in chosen and not (name == "served process" and "served lazy" in chosen):
                continue
            tag = name.split()[1]
            traces[name] = log_dir / f"{tag}.jsonl"
            env, cwd = dict(os.environ), server_cwd("mlx-serve", log_dir)
            if name == "served parent":
                if not args.parent_tree:
                    raise SystemExit("served parent needs --parent-tree DIR")
                cwd = Path(args.parent_tree).resolve()
                env["PYTHONPATH"] = os.pathsep.join([str(cwd), *filter(None, [env.get("PYTHONPATH")])])
            spec = ServerSpec(
                "mlx-serve", Path(args.model), [*flags, "--trace", str(traces[name]), *extra], env, cwd
            )
            servers[name] = start_server(spec, log_dir / f"{tag}.log")
            await wait_healthy(servers[name], 900)
            await wait_warmed(servers[name], 900)
            if args.pin is not None and (pid := engine_pid(servers[name].process.pid)) is not None:
                os.sched_setaffinity(pid, {args.pin})  # that process's main thread: the core's
                print(f"{name}: engine process {pid}'s main thread pinned to CPU {args.pin}", flush=True)
            clients[name] = httpx.AsyncClient(base_url=servers[name].base_url, timeout=900)
        local = {
            "direct here": lambda: direct_rate(model, tokenizer, prompt, args.tokens),
            "core here": lambda: core_rate(bare_core(model, tokenizer), prompt, args.tokens),
            "direct worker": lambda: in_worker("direct"),
            "core worker": lambda: in_worker("core"),
            "served core": lambda: in_worker("served core"),
            "served core framed": lambda: in_worker("served core framed"),
            "served core framed poll": lambda: in_worker("served core framed poll"),
            "served core framed every 4": lambda: in_worker("served core framed every 4"),
            "served core syscall": lambda: in_worker("served core syscall"),
        }
        names = [
            n
            for n in (
                *local,
                "served process",
                "served lazy",
                "served thread",
                "served plain",
                "served parent",
            )
            if n in chosen
        ]
        rates: dict[str, list[float]] = {k: [] for k in names}
        order: list[str] = []  # which server each traced request went to
        for r in range(args.rounds + 2):  # two warm-up rounds
            for name in names:
                if name in local:
                    got = local[name]()
                elif name == "served lazy":  # twice the time the last served request took
                    last = rates.get("served process", [100.0])[-1] if rates.get("served process") else 100.0
                    got = await served_once(clients["served process"], args.tokens, 2 * args.tokens / last)
                else:
                    got = await served_once(clients[name], args.tokens)
                if r >= 2:
                    rates[name].append(got)
                    order.append(name)
        closing = local[ref]()  # brackets the last round
    finally:
        for c in clients.values():
            await c.aclose()
        for s in servers.values():
            stop_server(s)
        if proc.is_alive():
            here.send(None)
            proc.join(30)
    print(f"model {args.model}  {args.tokens} tokens  {args.rounds} rounds, interleaved  extra args {extra}")
    direct = [*rates[ref], closing]
    bracket = [(a + b) / 2 for a, b in itertools.pairwise(direct)]
    for name, rs in rates.items():
        line = rate_line(name, rs, rs if name == ref else bracket, 15)
        if name.startswith("served ") and not name.startswith("served core"):
            eng = engine_clock(traces, order, name, args.tokens)
            line += f"  engine clock {statistics.median(eng):.1f} tok/s"
        print(line, flush=True)


def engine_pid(server_pid: int) -> int | None:
    """The engine process under a server (multiprocessing's spawned child, not its resource
    tracker; none with `--engine thread`). Its main thread runs the core."""
    spawned = [
        p for p in descendants(server_pid)[1:] if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()
    ]
    return spawned[0] if spawned else None


def engine_clock(traces: dict[str, Path], order: list[str], name: str, n: int) -> list[float]:
    """Decode rates by the engine's --trace clock of the timed requests `name` sent."""
    server = "served process" if name == "served lazy" else name
    sent = [x for x in order if x in (server, "served lazy" if server == "served process" else "")]
    lines = [orjson.loads(x) for x in traces[server].read_text().splitlines()][-len(sent) :]
    return [
        (n - 1) / (e["finished"] - e["first_token"])
        for who, e in zip(sent, (x["engine_s"][0] for x in lines), strict=True)
        if who == name
    ]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--mlx-serve-args", default="", help="extra mlx-serve flags for both servers")
    p.add_argument(
        "--reference",
        default="direct here",
        choices=("direct here", "direct worker"),
        help="what the ratios are to",
    )
    p.add_argument(
        "--contexts",
        default="direct here,core here,direct worker,core worker,served core,served core framed,"
        "served process,served lazy,served thread,served plain",
        help="which contexts, comma-separated",
    )
    p.add_argument("--parent-tree", default="", metavar="DIR", help="the checkout `served parent` runs from")
    p.add_argument(
        "--pin",
        type=int,
        default=None,
        metavar="CPU",
        help="Linux: run every decoding thread (the worker's, the served engine's) on this CPU, "
        "and this process (the clients) and the servers on the others",
    )
    asyncio.run(main(p.parse_args()))
