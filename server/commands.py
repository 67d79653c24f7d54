"""`mlx-serve COMMAND`: the commands beside serving — serve, pull, ls, rm, ps, doctor, bench,
launch (engine.model's cache and memory facts; a running server's own endpoints).

Plain `mlx-serve [flags]` and `mlx-serve --model M` still serve (server.cli); `service` prints
deployment files (server.service); `launch` starts an agent CLI against us (server.launch).
"""

from __future__ import annotations

import logging
import shutil
import sys
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import httpx

from mlx_serve.server.local import KEY_ENV, auth_headers, server_url

USAGE = """\
usage: mlx-serve [COMMAND] [args]

  mlx-serve [flags]              serve (the default model unless --model; --help lists the flags)
  mlx-serve serve [MODEL] [flags] serve MODEL: a folder, a .gguf file, a shortcut or a Hub id
  mlx-serve pull MODEL           fetch and convert MODEL into the model cache now
  mlx-serve ls                   the models in the cache, and the shortcuts
  mlx-serve rm MODEL             remove a model from the cache
  mlx-serve ps [--url URL]       what a running server is doing
  mlx-serve doctor [MODEL]       device, BLAS, memory; with MODEL, whether and how it fits
  mlx-serve fit MODEL            the same as doctor MODEL
  mlx-serve bench NAME [args]    the benchmark suite (from a source checkout)
  mlx-serve launch claude|codex [CLI args]
                                 run Claude Code or Codex against this server (started if none runs)
  mlx-serve service print-plist|print-systemd [flags]
                                 a launchd plist or systemd unit for these flags

A running server is found at $MLX_SERVE_URL (default http://127.0.0.1:8080), with the key in
$MLX_SERVE_API_KEY when it needs one.
"""


def run(args: list[str]) -> int:
    """Run `args[0]`'s command with the rest; its exit status."""
    name, rest = args[0], args[1:]
    handlers: dict[str, Callable[[list[str]], int]] = {
        "pull": pull,
        "ls": ls,
        "rm": rm,
        "ps": ps,
        "doctor": doctor,
        "fit": fit,
        "bench": bench,
        "launch": launch,
    }
    if rest[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    return handlers[name](rest)


def serve_args(rest: list[str]) -> list[str]:
    """`serve [MODEL] [flags]` as the plain serving command's flags."""
    if rest and not rest[0].startswith("-"):
        return ["--model", rest[0], *rest[1:]]
    return rest


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pull(rest: list[str]) -> int:
    if len(rest) != 1:
        _say("usage: mlx-serve pull MODEL")
        return 2
    from mlx_serve.engine.model import loader

    loader.log.addHandler(_ProgressHandler())
    loader.log.setLevel("INFO")
    try:
        folder, model_id = loader.resolve(rest[0])
    except (OSError, ValueError, RuntimeError) as exc:
        _say(f"mlx-serve pull: {exc}")
        return 1
    print(f"{model_id}: ready in {folder} ({_size(folder) / 2**20:.0f} MiB)")
    return 0


class _ProgressHandler(logging.Handler):
    """The loader's progress lines (fetching, joining slices, converting) on stderr, as they come."""

    def emit(self, record: logging.LogRecord) -> None:
        _say(f"  {record.getMessage()}")


def cached_models() -> list[tuple[str, Path, int]]:
    """(name, path, bytes) of every model the cache holds: converted folders and joined GGUFs."""
    from mlx_serve.engine.model.loader import cache_root

    root = cache_root()
    found = []
    for folder in sorted((root / "gguf").glob("*")):
        if (folder / "config.json").is_file():
            found.append((folder.name, folder, _size(folder)))
    for gguf in sorted((root / "models").glob("*.gguf")):
        found.append((gguf.name, gguf, gguf.stat().st_size))
    return found


def ls(rest: list[str]) -> int:
    from mlx_serve.engine.model.loader import DEFAULT_MODEL_ID, SHORTCUTS

    rows = cached_models()
    if rows:
        width = max(len(name) for name, _, _ in rows)
        for name, _, size in rows:
            print(f"{name:<{width}}  {size / 2**20:8.0f} MiB")
    else:
        print("the model cache is empty")
    names = ", ".join(["(default) " + DEFAULT_MODEL_ID, *SHORTCUTS])
    print(f"\nshortcuts for --model / pull: {names}")
    return 0


def rm(rest: list[str]) -> int:
    if len(rest) != 1:
        _say("usage: mlx-serve rm MODEL   (a name that `mlx-serve ls` prints, or a shortcut)")
        return 2
    from mlx_serve.engine.model.loader import SHORTCUTS

    want = rest[0].lower()
    stem = SHORTCUTS[want].gguf.file_name.removesuffix(".gguf").lower() if want in SHORTCUTS else want
    gone = [(name, path) for name, path, _ in cached_models() if name.lower().startswith(stem)]
    if not gone:
        _say(f"mlx-serve rm: no cached model named {rest[0]!r} (see `mlx-serve ls`)")
        return 1
    for name, path in gone:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
        print(f"removed {name}")
    return 0


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def ps(rest: list[str]) -> int:
    url = server_url(rest)
    try:
        health = httpx.get(f"{url}/health", timeout=5)
        stats = httpx.get(f"{url}/stats", headers=auth_headers(), timeout=5)
    except httpx.HTTPError as exc:
        _say(f"mlx-serve ps: no server answers at {url} ({type(exc).__name__})")
        return 1
    body = stats.json() if stats.status_code == 200 else {}
    print(
        f"{url}: {health.json().get('status', health.status_code) if _is_json(health) else health.status_code}"
    )
    if stats.status_code != 200:
        print(f"  /stats answered {stats.status_code} (set {KEY_ENV} if the server needs a key)")
        return 0
    shown = {
        "state": "engine",
        "num_requests_running": "rows running",
        "num_requests_waiting": "waiting",
        "kv_cache_usage_perc": "KV cache use",
        "requests_finished": "requests finished",
        "prompt_tokens": "prompt tokens",
        "prefill_tokens": "of which computed (the rest from the prefix cache)",
        "generated_tokens": "tokens generated",
    }
    for key, label in shown.items():
        if key in body:
            print(f"  {label}: {body[key]}")
    return 0


def _is_json(response: httpx.Response) -> bool:
    return bool(response.headers.get("content-type", "").startswith("application/json"))


def doctor(rest: list[str]) -> int:
    from mlx_serve.engine.host.build import prepare_process

    prepare_process("auto")
    from mlx_serve.engine.model.backend import device_name
    from mlx_serve.engine.model.blas import blas_in_use
    from mlx_serve.engine.model.memory_budget import default_budget, total_ram_bytes

    budget = default_budget()
    print(f"device: {device_name()}")
    print(f"mlx {version('mlx')}; BLAS: {blas_in_use()}")
    print(
        f"memory: {total_ram_bytes() / 2**30:.1f} GiB; budget: {budget.nbytes / 2**30:.1f} GiB ({budget.source})"
    )
    if rest:
        return fit(rest)
    return 0


def fit(rest: list[str]) -> int:
    if len(rest) != 1:
        _say("usage: mlx-serve fit MODEL")
        return 2
    import mlx.core as mx

    from mlx_serve.engine.model import fit as fitting
    from mlx_serve.engine.model.loader import SHORTCUTS, cache_root, default_gguf
    from mlx_serve.engine.model.memory_budget import default_budget

    spec, budget = rest[0], default_budget().nbytes
    float32 = mx.default_device() == mx.cpu  # what --dequantize auto serves on a CPU
    path = Path(spec).expanduser()
    if spec.lower() in ("default", "smollm2"):
        path = default_gguf()
    elif spec.lower() in SHORTCUTS:
        path = cache_root() / "models" / SHORTCUTS[spec.lower()].gguf.file_name
        if not path.is_file():
            _say(f"mlx-serve fit: {spec} is not in the cache yet: `mlx-serve pull {spec}` first")
            return 1
    if path.suffix == ".gguf" and path.is_file():
        result = fitting.fit_gguf(path, budget, float32)
    elif (path / "config.json").is_file():
        result = fitting.fit_folder(path, budget, float32)
    else:
        _say(f"mlx-serve fit: {spec} is neither a model folder, a .gguf file nor a shortcut")
        return 1
    print("\n".join(result.lines()))
    return 0


def bench(rest: list[str]) -> int:
    try:
        import bench as suite  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        _say("mlx-serve bench: the benchmark suite runs from a source checkout (python -m bench)")
        return 1
    main = getattr(suite, "main", None)
    if main is None:
        _say("mlx-serve bench: this checkout's bench has no main(); run python -m bench")
        return 1
    return int(main(rest) or 0)


def launch(rest: list[str]) -> int:
    from mlx_serve.server.launch import launch as launch_cli

    return launch_cli(rest)
