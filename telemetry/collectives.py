"""Every collective a trainer issues, counted: bytes and seconds by process group and kind.

While recording, torch.distributed's collectives (the ones FSDP2 and the trainer call through the
`torch.distributed` namespace) are wrapped: each call's payload is counted and the call waits for its
own end, the GPU synchronized around it, so its seconds are its own. A step therefore runs slower
while it records: the overlap of communication and compute that FSDP2 arranges is gone. Bytes are
what one rank sends under a ring algorithm: (n-1)/n of the whole tensor for an all-gather or a
reduce-scatter, twice that for an all-reduce, the tensor for a broadcast; a group of one sends
nothing. DTensor's functional collectives (the gradient norm's scalars, a save's gathers) are not seen.
"""
from __future__ import annotations

import time
from collections import defaultdict

import torch
import torch.distributed as dist

# torch.distributed function -> (kind, the argument holding the whole tensor)
WRAPPED = {
    "all_gather_into_tensor": ("all_gather", "output_tensor"),
    "all_gather_single": ("all_gather", "output_tensor"),
    "reduce_scatter_tensor": ("reduce_scatter", "input"),
    "reduce_scatter_single": ("reduce_scatter", "input"),
    "all_reduce": ("all_reduce", "tensor"),
    "broadcast": ("broadcast", "tensor"),
}
RING_FACTOR = {"all_gather": 1.0, "reduce_scatter": 1.0, "all_reduce": 2.0}


def wire_bytes(kind: str, payload: int, group_size: int) -> float:
    """Bytes one rank sends for a collective over `payload` bytes (the whole tensor) in a ring."""
    if group_size <= 1:
        return 0.0
    if kind == "broadcast":
        return float(payload)
    return RING_FACTOR[kind] * payload * (group_size - 1) / group_size


class CollectiveRecorder:
    """`names`: {process group name: what to call it in metrics} (e.g. the device mesh's dimensions);
    the default group is `world`, another unnamed one `size<N>`."""

    def __init__(self, names: dict[str, str] | None = None, device: str = "cpu"):
        self.names, self.sync = dict(names or {}), device.startswith("cuda")
        self.totals: dict[str, float] = defaultdict(float)
        self._originals: dict = {}
        self._depth = 0  # a recorded pass may call another (train scores the old policy): wrap once

    def __enter__(self) -> "CollectiveRecorder":
        import inspect
        self._depth += 1
        if self._depth > 1:
            return self
        for name, (kind, whole) in WRAPPED.items():
            original = getattr(dist, name, None)
            if original is None:  # a release without it
                continue
            self._originals[name] = original
            setattr(dist, name, self._wrap(original, kind, whole, inspect.signature(original)))
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth:
            return
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals = {}

    def _wrap(self, original, kind: str, whole: str, signature):
        def recorded(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            tensor, group = bound.arguments[whole], bound.arguments.get("group")
            if self.sync:
                torch.cuda.synchronize()
            started = time.perf_counter()
            work = original(*args, **kwargs)
            if work is not None:
                work.wait()
            if self.sync:
                torch.cuda.synchronize()
            size = dist.get_world_size(group)
            label = "world" if group is None else self.names.get(group.group_name, f"size{size}")
            key = f"comm/{label}/{kind}"
            self.totals[f"{key}_bytes"] += wire_bytes(kind, tensor.numel() * tensor.element_size(), size)
            self.totals[f"{key}_s"] += time.perf_counter() - started
            self.totals[f"{key}_calls"] += 1
            return work
        recorded.__wrapped__ = original
        return recorded

    def take(self) -> dict:
        """The totals since the last take (and their sums over groups and kinds), then zero."""
        out = dict(self.totals)
        if out:
            out["comm/total_bytes"] = sum(v for k, v in out.items() if k.endswith("_bytes"))
            out["comm/total_s"] = sum(v for k, v in out.items() if k.endswith("_s"))
        self.totals.clear()
        return out
