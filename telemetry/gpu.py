"""GPU memory as the driver sees it (NVML), for processes that hold no CUDA context of their own.

vLLM runs its model in a child process (its engine core), so torch's counters in the actor that
owns the engine read zero; NVML lists the memory of every process on the device. Without NVML (no
GPU, or a driver that does not list processes) the functions return None and callers leave the
metric out.
"""
from __future__ import annotations

import os


def _nvml():
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no library, no driver, no GPU
        return None


def _visible_device(nvml):
    """The NVML handle of this process's first visible GPU (CUDA_VISIBLE_DEVICES: an index or a UUID)."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    if first.isdigit():
        return nvml.nvmlDeviceGetHandleByIndex(int(first))
    return nvml.nvmlDeviceGetHandleByUUID(first)


def process_tree_memory_gib(pid: int | None = None) -> float | None:
    """GPU memory held on this process's GPU by `pid` (default: this process) and its descendants."""
    import psutil
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        root = psutil.Process(pid or os.getpid())
        pids = {root.pid} | {c.pid for c in root.children(recursive=True)}
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(_visible_device(nvml))
    except Exception:
        return None
    used = [p.usedGpuMemory for p in procs if p.pid in pids and p.usedGpuMemory is not None]
    return sum(used) / 2 ** 30 if used else 0.0


def device_memory_used_gib() -> float | None:
    """Memory in use on this process's GPU, by every process on it."""
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        return nvml.nvmlDeviceGetMemoryInfo(_visible_device(nvml)).used / 2 ** 30
    except Exception:
        return None
