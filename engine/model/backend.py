"""Settings MLX's backends need for serving, made before the engine's first forward.

MLX's CUDA backend runs attention over more than one query (a prompt chunk, a speculative
verify step) in bfloat16/float16 through cuDNN, and builds a cuDNN graph per query and key
shape the first time it meets one. A server meets new shapes all the time: every prompt
length, and on every speculative step (the key length grows each step). Measured on an H200
with a 1B bf16 model: 60-100 ms to prefill a prompt of a length not seen before (7.7 ms
after), a verify step 78-87 ms instead of 10; with MLX's own attention (matmuls and a
softmax, no graph) 11-52 ms and 16 ms. So mlx-serve turns cuDNN attention off unless the
environment says otherwise; single-query decode steps never used it in a batch.
"""

from __future__ import annotations

import os

CUDNN_ATTENTION = "MLX_CUDA_USE_CUDNN_SDPA"


def prefer_shape_free_attention() -> None:
    """Off unless already set (a user may set MLX_CUDA_USE_CUDNN_SDPA=1 to keep cuDNN)."""
    os.environ.setdefault(CUDNN_ATTENTION, "0")


def device_name() -> str:
    """The default device as a person reads it: "CPU (N cores)" or "GPU (its name)"."""
    import mlx.core as mx

    if mx.default_device().type == mx.DeviceType.gpu:
        info = mx.device_info()
        return f"GPU ({info.get('device_name') or info.get('architecture') or 'unnamed'})"
    return f"CPU ({os.cpu_count()} cores)"
