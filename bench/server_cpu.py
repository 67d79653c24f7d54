"""The server process's own CPU time per streamed chunk, one stream at a time (Linux /proc).

    python -m bench.server_cpu --model DIR [--tokens 512] [--requests 3] [--mlx-serve-args '...']

Starts mlx-serve from the checkout this file is in (so `PYTHONPATH=OTHER python -m
bench.server_cpu` run from OTHER measures that checkout), streams `--requests` chat requests one
after another and prints, per request, the chunk rate and the CPU time (user + system, from
/proc/PID/stat) the server process, its engine child and this client spent per chunk. The
server's share is what the HTTP side costs a token: it runs beside the engine on the same host.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import httpx

from bench.servers import REPO_ROOT, free_port


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(args: argparse.Namespace) -> None:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "server",
        "--model",
        args.model,
        "--port",
        str(port),
        *args.mlx_serve_args.split(),
    ]
    server = subprocess.Popen(
        argv, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=600) as client:
            while True:
                try:
                    if client.get(base + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None:
                    raise SystemExit("the server exited")
                time.sleep(0.5)
            found = subprocess.run(
                ["pgrep", "-P", str(server.pid), "-f", "spawn_main"],
                check=False,
                capture_output=True,
                text=True,
            ).stdout.split()
            engine = int(found[0]) if found else None  # None: --engine thread
            body = {
                "model": "default_model",
                "messages": [{"role": "user", "content": "Write a long story."}],
                "max_tokens": args.tokens,
                "temperature": 0,
                "stream": True,
            }
            for _ in range(args.requests):
                s0, e0, c0 = cpu_s(server.pid), cpu_s(engine) if engine else 0.0, time.process_time()
                t0, n = time.perf_counter(), 0
                with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
                    for line in r.iter_lines():
                        n += line.startswith("data: {")
                dt = time.perf_counter() - t0
                s1, e1, c1 = cpu_s(server.pid), cpu_s(engine) if engine else 0.0, time.process_time()
                print(
                    f"chunks {n} in {dt:.2f}s ({n / dt:.0f}/s): server {1e6 * (s1 - s0) / n:.0f} us/chunk, "
                    f"engine {1e6 * (e1 - e0) / n:.0f} us/chunk, client {1e6 * (c1 - c0) / n:.0f} us/chunk",
                    flush=True,
                )
    finally:
        os.killpg(server.pid, 15)
        server.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--requests", type=int, default=3)
    p.add_argument("--mlx-serve-args", default="")
    main(p.parse_args())
