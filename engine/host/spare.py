"""An engine process started at launch, importing MLX and mlx-lm while the server starts.

A one-model server's critical path at start-up was serial: the server's own imports, then the
engine process's spawn, whose interpreter imports MLX, mlx-lm and transformers again (~1.1 s of
a 2-core CPU's start) before it loads a weight. `start_spare()` (server.cli, once the
configuration is read) spawns the process at once, waiting for its work; engine.host.process
takes it for its first child and sends it the entry point and its arguments, so those imports
overlap the server's start-up. A server that never takes it (an embedding model, a thread host)
discards it; a spare whose server is gone reads the end of its pipe and exits.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

_spare: tuple[Any, Any] | None = None  # (process, the server's end of its pipe)


def start_spare() -> None:
    global _spare
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_wait_for_work, args=(child,), name="mlx-serve-engine", daemon=True)
    process.start()
    child.close()
    _spare = (process, parent)


def take_spare() -> tuple[Any, Any] | None:
    """The spare process and its pipe, once; None when there is none (or it died)."""
    global _spare
    spare, _spare = _spare, None
    if spare is not None and not spare[0].is_alive():
        spare[1].close()
        return None
    return spare


def discard_spare() -> None:
    spare = take_spare()
    if spare is not None:
        spare[1].close()  # it reads the end and exits
        spare[0].join(5)
        if spare[0].is_alive():
            spare[0].terminate()


def _wait_for_work(conn: Any) -> None:
    import mlx.core  # noqa: F401 - the slow imports, while the server starts
    import mlx_lm.utils  # noqa: F401

    from mlx_serve.engine.host import assemble, process_child  # noqa: F401 - the engine's own

    try:
        target, args = conn.recv()
    except (EOFError, OSError):
        return
    target(conn, *args)
