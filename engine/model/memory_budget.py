"""The memory budget: the bytes the memory plan may fill, from --memory-budget or a safe share
of what the default device holds (default_budget).

Apart from engine.batch.admission, which plans within it: it reads the machine, not the model
(engine.model.loader asks it for the RAM too).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# Leaves 30% of RAM to the OS, the server process, MLX's buffer cache and fragmentation.
CPU_RAM_FRACTION = 0.7
# Metal's recommended working set (or CUDA's memory) is already a device ceiling: keep 10% spare
# for allocator fragmentation and cached buffers.
GPU_MEMORY_FRACTION = 0.9
CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    nbytes: int
    source: str  # how it was chosen, for the startup banner


def default_budget() -> MemoryBudget:
    """A safe share of what the default device can hold (see the *_FRACTION constants)."""
    import mlx.core as mx

    if mx.default_device().type == mx.DeviceType.gpu:
        info = mx.device_info()
        working_set = info.get("max_recommended_working_set_size")
        if isinstance(working_set, int) and working_set > 0:
            return MemoryBudget(
                int(GPU_MEMORY_FRACTION * working_set),
                f"{GPU_MEMORY_FRACTION:.0%} of Metal's recommended working set",
            )
        total, free = info.get("total_memory"), info.get("free_memory")
        if isinstance(total, int) and total > 0:
            # A shared GPU: what is free now plus what this process already holds.
            ours = mx.get_active_memory() + mx.get_cache_memory()
            usable = min(total, free + ours) if isinstance(free, int) else total
            return MemoryBudget(int(GPU_MEMORY_FRACTION * usable), f"{GPU_MEMORY_FRACTION:.0%} of GPU memory")
    return MemoryBudget(int(CPU_RAM_FRACTION * total_ram_bytes()), f"{CPU_RAM_FRACTION:.0%} of RAM")


def total_ram_bytes() -> int:
    """Physical RAM, or the container's memory limit when that is lower."""
    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for name in CGROUP_LIMIT_FILES:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            ram = min(ram, int(text))
    return ram
