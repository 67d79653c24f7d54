"""The engine: admission, the continuous-batching scheduler, the runner and speculation on MLX.

Importing it keeps PyTorch out of the process (`keep_torch_out`), so that both the server
process (which loads the tokenizer) and the engine process (which imports mlx-lm) start
without it.
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


keep_torch_out()
