"""The suite's one entry point: every named benchmark, the flags they share, the machine line."""

from __future__ import annotations

import os
from pathlib import Path

from bench import BENCHMARKS, parser
from bench.common import clients
from bench.machine import describe


def test_every_named_benchmark_parses_the_shared_flags() -> None:
    named = {"serve", "stream", "agent", "mixed", "speculation", "startup", "loop", "embed", "models"}
    assert set(BENCHMARKS) == named
    for name in BENCHMARKS:
        args = parser().parse_args(
            [name, "--model", "m", "--rounds", "4", "--clients", "1,16,64", "--json", "o.json"]
        )
        assert (args.benchmark, args.model, args.rounds, args.json) == (name, "m", 4, Path("o.json"))
        assert clients(args) == [1, 16, 64]


def test_each_benchmark_has_its_own_defaults_and_flags() -> None:
    serve = parser().parse_args(["serve"])
    assert (serve.clients, serve.rounds, serve.model) == ("1,16,64", 2, None)
    agent = parser().parse_args(["agent", "--system-tokens", "30000", "--turns", "4"])
    assert (agent.system_tokens, agent.turns, agent.turn_tokens, agent.replay) == (30000, 4, 400, None)
    assert parser().parse_args(["mixed"]).long_tokens == 8000


def test_the_machine_line_names_cpu_cores_memory_gpu_and_blas() -> None:
    line = describe().line()
    assert line.startswith("machine: ") and f"{os.cpu_count()} cores" in line
    assert "GiB; GPU " in line and "BLAS " in line and "mlx " in line
