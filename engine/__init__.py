"""The engine: admission, the continuous-batching scheduler, the runner and speculation on MLX.

Importing it keeps PyTorch out of the process (`keep_torch_out`), so that both the server
process (which loads the tokenizer) and the engine process (which imports mlx-lm) start
without it, and shortens the interpreter's thread switch interval (`prompt_thread_switches`) in
both.
"""

from __future__ import annotations

import os
import sys

IMPORT_TORCH_ENV = "MLX_SERVE_IMPORT_TORCH"


def keep_torch_out() -> bool:
    """Mark PyTorch absent in this process, unless it is already imported or
    MLX_SERVE_IMPORT_TORCH=1; True when it did.

    mlx-lm imports transformers, and transformers imports torch whenever it is installed (and
    torch imports sympy): 10-12 s of an H200 host's start-up, for a library nothing here calls —
    the tokenizers and chat templates we load need no torch. `None` in sys.modules is Python's
    own "not installed": `importlib.util.find_spec` returns None for it (transformers' check)
    and `import torch` raises ImportError, so transformers takes its torch-free path. A
    trust_remote_code tokenizer that needs torch runs with MLX_SERVE_IMPORT_TORCH=1.
    """
    if os.environ.get(IMPORT_TORCH_ENV, "") not in ("", "0") or "torch" in sys.modules:
        return False
    sys.modules["torch"] = None  # type: ignore[assignment]  # None: "not installed", by design
    return True


# Seconds a thread back from blocking I/O waits for a busy thread to give up the GIL.
SWITCH_INTERVAL_S = 0.0005


def prompt_thread_switches() -> None:
    """Let a thread that wakes from I/O have the GIL within SWITCH_INTERVAL_S, not Python's 5 ms.

    Each process has a busy thread and threads that mostly wait: in the engine process the
    owner thread steps the batch while a reader takes requests off the pipe; in the server the
    event loop serves while worker threads parse and template big requests (the engine's events
    need no thread: the loop reads them, engine.host.frames). A waking thread gets
    the GIL only when the busy thread drops it — at once when that thread waits on the
    accelerator or the network, else after the switch interval — and receiving one message
    takes it two or three times (length, body, the loop's wake-up), so at 5 ms each message in
    a burst could wait up to ~10-15 ms, one after the other (a trace at 64 clients on the H200
    had requests reach the core 69 ms after the server submitted them). The interval only
    bounds that wait: it costs nothing while no other thread wants the GIL.
    """
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)


keep_torch_out()
prompt_thread_switches()
