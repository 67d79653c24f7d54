"""mlx-serve's benchmark suite: `python -m bench NAME [flags]`, or `bench.main(argv)`.

Each benchmark measures mlx-serve beside its references (mlx_lm.server, mlx-lm called
directly) in one run, prints ratios and the machine, and can save its raw numbers (--json).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = {
    "serve": "bench.serve",
    "stream": "bench.stream",
    "agent": "bench.agent",
    "mixed": "bench.mixed",
    "speculation": "bench.speculation",
    "startup": "bench.startup",
    "loop": "bench.loop",
    "embed": "bench.embed",
    "models": "bench.models",
}


def benchmark(name: str) -> ModuleType:
    """The module of benchmark `name`: it has `add_arguments(parser)` and `run(args) -> dict`."""
    return importlib.import_module(BENCHMARKS[name])


def parser() -> argparse.ArgumentParser:
    from bench.common import add_common

    top = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="benchmark", required=True, metavar="NAME")
    for name in BENCHMARKS:
        module = benchmark(name)
        doc = module.__doc__ or name
        p = sub.add_parser(
            name,
            help=doc.splitlines()[0],
            description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        add_common(p, **getattr(module, "DEFAULTS", {}))
        module.add_arguments(p)
    return top


def main(argv: list[str] | None = None) -> int:
    """Run one benchmark; 0 when it ran to the end."""
    args = parser().parse_args(argv)
    from bench.common import reexec_with_openblas

    reexec_with_openblas(args, sys.argv[1:] if argv is None else argv)
    result = benchmark(args.benchmark).run(args)
    if args.json:
        save(args.json, args, result)
    return 0


def save(path: Path, args: argparse.Namespace, result: dict[str, object]) -> None:
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    path.write_text(json.dumps({"config": config, **result}, indent=1, default=str))
    print(f"\nwrote {path}", flush=True)


__all__ = ["BENCHMARKS", "main"]
