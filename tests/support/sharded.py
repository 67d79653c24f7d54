"""A sharded mlx-serve on loopback: two ranks of `python -m mlx_serve --shard MODE`, ring backend."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from bench.servers import descendants
from tests.support.server_proc import ROOT, free_port, wait_healthy


def free_port_pair() -> int:
    """A port p with p and p + 1 both free (mlx.launch's ring ranks listen on consecutive ports)."""
    for _ in range(50):
        p = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no two consecutive free ports")


class ShardedGroup:
    """Starts the ranks, waits for rank 0's /health 200, and stops every process on close().

    launcher "mlx.launch": the command users run. launcher "env": each rank started here with the
    MLX_RANK and MLX_HOSTFILE that mlx.launch would set, as one service per machine would be;
    mlx.launch stops every rank once one dies, while this keeps rank 0 up to report it.
    """

    def __init__(
        self, args: list[str], log_dir: Path, *, launcher: str = "mlx.launch", ready_timeout_s: float = 300.0
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        ring = free_port_pair()
        cmd = [sys.executable, "-m", "mlx_serve", "--port", str(self.port), *args]
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # two ranks share two cores
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs = []
        if launcher == "mlx.launch":
            launch = [
                str(Path(sys.executable).parent / "mlx.launch"),
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
                *cmd,
            ]
            self._start(launch, env, "group")
        else:
            hostfile = log_dir / "hosts.json"
            hostfile.write_text(json.dumps([[f"127.0.0.1:{ring}"], [f"127.0.0.1:{ring + 1}"]]))
            for rank in (0, 1):
                self._start(cmd, {**env, "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}, f"rank{rank}")
        self._wait_ready(ready_timeout_s)

    def _start(self, cmd: list[str], env: dict[str, str], name: str) -> None:
        log = (self.log_dir / f"{name}.log").open("wb")
        self._logs.append(log)
        self.procs.append(
            subprocess.Popen(
                cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        )

    def _wait_ready(self, timeout_s: float) -> None:
        why = wait_healthy(self.url, lambda: any(p.poll() is not None for p in self.procs), timeout_s)
        if why is not None:
            self.close()
            raise RuntimeError(f"sharded server not ready ({why}):\n{self.log()}")

    def log(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')}" for p in sorted(self.log_dir.glob("*.log"))
        )

    def follower_pid(self) -> int:
        """The pid of the rank-1 server process (under mlx.launch: found by its MLX_RANK)."""
        for pid in descendants(self.procs[0].pid) if len(self.procs) == 1 else [self.procs[1].pid]:
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"MLX_RANK=1" in environ and b"-m\0mlx_serve" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        raise RuntimeError("no rank 1 process")

    def close(self) -> None:
        for p in self.procs:  # each was started as its own session: end its whole process group
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        for log in self._logs:
            log.close()
