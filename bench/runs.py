"""The three contestants of a side-by-side run: each server under load, and direct mlx-lm."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.load import LevelResult, LoadSpec, run_level
from bench.prompts import PromptBook
from bench.report import gap_stats
from bench.servers import (
    REPO_ROOT,
    RunningServer,
    ServerSpec,
    ServerStartError,
    blas_banner,
    loaded_blas_libs,
    log_tail,
    start_server,
    stop_server,
    wait_healthy,
    wait_warmed,
)

LEVEL_INDEX_STRIDE = 1_000_000
WARMUP_INDEX_OFFSET = 500_000
DIRECT_INDEX_BASE = 900_000_000


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """What every server is asked to do, identically."""

    levels: list[int]
    requests_per_level: int | None
    max_tokens: int
    warmup: bool
    warmup_tokens: int
    model_field: str
    startup_timeout_s: float
    client_processes: int = 1  # the most processes a level's clients are spread over

    def processes_for(self, concurrency: int) -> int:
        """One client process per 8 clients, up to client_processes."""
        return max(1, min(self.client_processes, -(-concurrency // 8)))

    def num_requests(self, concurrency: int) -> int:
        return max(concurrency, self.requests_per_level or max(4, 2 * concurrency))


@dataclass(slots=True)
class ServerOutcome:
    name: str
    log_path: Path
    error: str | None = None
    startup_s: float | None = None
    blas_banner: list[str] = field(default_factory=list)
    blas_libs: list[str] = field(default_factory=list)
    levels: list[LevelResult] = field(default_factory=list)


def level_spec(plan: LoadPlan, book: PromptBook, number: int, concurrency: int, warmup: bool) -> LoadSpec:
    first = number * LEVEL_INDEX_STRIDE + (WARMUP_INDEX_OFFSET if warmup else 0)
    return LoadSpec(
        concurrency=concurrency,
        num_requests=concurrency if warmup else plan.num_requests(concurrency),
        max_tokens=plan.warmup_tokens if warmup else plan.max_tokens,
        first_index=first,
        model_field=plan.model_field,
        prompt_for=book.get,
    )


async def drive_levels(
    server: RunningServer, plan: LoadPlan, book: PromptBook, outcome: ServerOutcome
) -> None:
    """Warm up each level's shape (C concurrent short requests), then measure it."""
    for number, concurrency in enumerate(plan.levels, start=1):
        if plan.warmup:
            warm = await run_level(
                server.base_url,
                level_spec(plan, book, number, concurrency, True),
                plan.processes_for(concurrency),
            )
            failed = sum(not r.ok for r in warm.records)
            if failed:
                print(f"  {outcome.name} C={concurrency}: {failed} warm-up request(s) failed", flush=True)
        with health_probe(server.base_url) as probes:
            level = await run_level(
                server.base_url,
                level_spec(plan, book, number, concurrency, False),
                plan.processes_for(concurrency),
            )
        outcome.levels.append(level)
        failed = sum(not r.ok for r in level.records)
        print(
            f"  {outcome.name} C={concurrency}: {len(level.records) - failed} ok, {failed} failed"
            f" in {level.wall_s:.1f} s; {describe_probes(probes)}",
            flush=True,
        )
        if failed and (down := await why_down(server)):
            outcome.error = f"after C={concurrency}: {down}"
            return


@contextlib.contextmanager
def health_probe(base_url: str) -> Iterator[list[float]]:
    """/health latencies (ms) while the block runs, polled from a process of its own."""
    probes: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-health-") as tmp:
        out = Path(tmp) / "health.txt"
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.health_probe", base_url, str(out)], cwd=REPO_ROOT
        )
        try:
            yield probes
        finally:
            proc.terminate()
            proc.wait(30)
            if out.exists():
                probes += [float(x) for x in out.read_text().split()]


def describe_probes(probes: list[float]) -> str:
    if not probes:
        return "/health not probed"
    return f"/health x{len(probes)}: {gap_stats(probes)}"


async def why_down(server: RunningServer) -> str | None:
    """None while the server lives and answers /health; else what is wrong with it."""
    if server.process.poll() is not None:
        return f"server exited with code {server.process.returncode}: {log_tail(server.log_path)}"
    try:
        async with httpx.AsyncClient(timeout=10.0) as client:
            status = (await client.get(server.base_url + "/health")).status_code
    except httpx.HTTPError as exc:
        return f"server process alive but /health fails ({type(exc).__name__}): {log_tail(server.log_path)}"
    return None if status == 200 else f"/health answers {status}"


async def run_server(spec: ServerSpec, plan: LoadPlan, book: PromptBook, log_dir: Path) -> ServerOutcome:
    """Start one server, load it level by level, stop it; failures become `outcome.error`."""
    outcome = ServerOutcome(spec.name, log_dir / f"{spec.name}.log")
    try:
        server = start_server(spec, outcome.log_path)
    except OSError as exc:
        outcome.error = f"cannot start: {exc}"
        return outcome
    print(f"started {spec.name}: {' '.join(server.argv)} (log {outcome.log_path})", flush=True)
    try:
        await wait_healthy(server, plan.startup_timeout_s)
        await wait_warmed(server, plan.startup_timeout_s)
        outcome.startup_s = server.startup_s
        outcome.blas_libs = loaded_blas_libs(server.process.pid)
        outcome.blas_banner = blas_banner(outcome.log_path)
        print(f"  {spec.name} healthy after {server.startup_s:.1f} s", flush=True)
        await drive_levels(server, plan, book, outcome)
    except ServerStartError as exc:
        outcome.error = str(exc)
    finally:
        stop_server(server)
    outcome.blas_banner = outcome.blas_banner or blas_banner(outcome.log_path)
    return outcome


def run_direct(
    model_dir: Path, book: PromptBook, plan: LoadPlan, runs: int, batch: list[int]
) -> dict[str, Any]:
    """Run bench.direct in a subprocess (`stream_generate`, and `batch_generate` at each B of
    `batch`); returns its JSON, or {'error': ...}."""
    with tempfile.TemporaryDirectory(prefix="bench-direct-") as tmp:
        out = Path(tmp) / "direct.json"
        argv = [sys.executable, "-m", "bench.direct", "--out", str(out)]
        prompts = [book.get(DIRECT_INDEX_BASE + i).messages for i in range(max(runs + 1, *batch, 1))]
        (Path(tmp) / "prompts.json").write_text(json.dumps(prompts))
        argv += ["--model", str(model_dir), "--prompts", str(Path(tmp) / "prompts.json")]
        argv += ["--max-tokens", str(plan.max_tokens), "--runs", str(runs), "--warmup-runs", "1"]
        if batch:
            argv += ["--batch", ",".join(map(str, batch))]
        done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.exists():
            tail = " | ".join(done.stderr.strip().splitlines()[-8:])
            return {"error": f"bench.direct exited {done.returncode}: {tail}"}
        return json.loads(out.read_text())  # type: ignore[no-any-return]


def run_servers(
    specs: list[ServerSpec], plan: LoadPlan, book: PromptBook, log_dir: Path
) -> list[ServerOutcome]:
    """One server at a time, so none competes with another for cores or memory."""
    return [asyncio.run(run_server(spec, plan, book, log_dir)) for spec in specs]
