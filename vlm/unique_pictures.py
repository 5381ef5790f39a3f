"""The vision tower runs once for each distinct picture of a batch, not once for each copy.

A GRPO group plays one maze n times from the same start, so its episodes keep showing the same
pictures: one step of the CPU default shows 967 pictures of which 109 differ, and the frozen
vision tower was 40% of the step's time (half the rollout, a third of the train pass). The tower
encodes each picture on its own (its attention stays within a picture), so its features for a
copy are its features for the original. This wraps the tower's forward: it finds the batch's
exact duplicates, encodes the distinct pictures, and hands each copy its original's rows.
Gradients still reach a trainable tower (LoRA on it): the copies' rows are an index_select, whose
backward sums into the original. With no duplicate, or with precomputed per-picture inputs
(transformers lets a caller pass the pictures' `cu_seqlens` and positions), the tower runs as
before.
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from vlm.patching import replace_method


def encode_unique_pictures(model) -> int:
    """Give the vision tower(s) of `model` (modules named `visual`) the forward that encodes each
    distinct picture once; returns how many were wrapped."""
    return replace_method(model, "forward", lambda name, _: name.split(".")[-1] == "visual", _unique_forward)


def distinct_pictures(patches: torch.Tensor, grid_thw: torch.Tensor) -> tuple[list[int], list[int]]:
    """(the first copy of each distinct picture, each picture's index into that list). Pictures are
    the consecutive row blocks of `patches` that `grid_thw` sizes; two are the same only when
    their sizes and all their values are equal."""
    grids = [tuple(g) for g in grid_thw.tolist()]
    starts = np.concatenate([[0], np.cumsum([t * h * w for t, h, w in grids])]).tolist()
    first = list(range(len(grids)))
    by_grid: dict[tuple, list[int]] = {}
    for i, g in enumerate(grids):
        by_grid.setdefault(g, []).append(i)
    for members in by_grid.values():
        if len(members) < 2:
            continue
        if len(members) == len(grids):  # one size: the pictures are the rows of a view, no copy
            rows = patches.reshape(len(grids), -1)
        else:
            rows = torch.stack([patches[starts[i]:starts[i + 1]].reshape(-1) for i in members])
        seen: dict[int, int] = {}
        candidate = [seen.setdefault(p, k) for k, p in enumerate(_fingerprints(rows))]
        copies = [k for k in range(len(members)) if candidate[k] != k]
        if not copies:
            continue
        same = (rows[copies] == rows[[candidate[k] for k in copies]]).all(-1).tolist()
        for k, equal in zip(copies, same):
            if equal:
                first[members[k]] = members[candidate[k]]
    unique = sorted(set(first))
    position = {i: u for u, i in enumerate(unique)}
    return unique, [position[first[i]] for i in range(len(grids))]


def _fingerprints(rows: torch.Tensor, chunk: int = 32) -> list[int]:
    """One integer a row: its values' bit patterns times fixed random weights, summed in int64.
    Integer sums wrap but never round, so equal rows always get equal prints (a float projection
    did not: one GEMV gave two copies of a picture prints 3e-6 apart). Chunks bound the int64 copy."""
    bits = rows.contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[rows.element_size()])
    weights = _weights(rows.shape[1], rows.device)
    return torch.cat([(part.long() * weights).sum(-1) for part in bits.split(chunk)]).tolist()


@functools.lru_cache(maxsize=8)
def _weights(length: int, device: torch.device) -> torch.Tensor:
    return torch.randint(1, 2**62, (length,), generator=torch.Generator().manual_seed(0)).to(device)


def _unique_forward(tower_forward, module):
    def forward(self, hidden_states: torch.Tensor, grid_thw: torch.Tensor, **kwargs):
        if any(torch.is_tensor(v) for v in kwargs.values()):  # precomputed per-picture inputs (cu_seqlens, ...)
            return tower_forward(self, hidden_states, grid_thw=grid_thw, **kwargs)
        unique, inverse = distinct_pictures(hidden_states, grid_thw)
        if len(unique) == len(inverse):
            return tower_forward(self, hidden_states, grid_thw=grid_thw, **kwargs)
        sizes = grid_thw.prod(-1).tolist()
        starts = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        keep = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in unique])
        out = tower_forward(self, hidden_states[torch.from_numpy(keep).to(hidden_states.device)],
                            grid_thw=grid_thw[unique], **kwargs)
        kept = [sizes[i] for i in unique]
        copies = {}  # output rows -> the index that gives every picture its original's rows

        def expand(x):
            if not torch.is_tensor(x) or x.dim() == 0:
                return x
            total = x.shape[0]
            if total not in copies:  # one row a patch, or one a merge^2 patches after the merger
                if any(s * total % sum(kept) for s in kept):
                    raise ValueError(f"a vision output of {total} rows does not split over pictures of {kept} patches")
                begin = np.concatenate([[0], np.cumsum([s * total // sum(kept) for s in kept])]).astype(int)
                copies[total] = torch.from_numpy(np.concatenate(
                    [np.arange(begin[u], begin[u + 1]) for u in inverse])).to(x.device)
            return x.index_select(0, copies[total])
        return _map_output(out, expand)
    return forward


def _map_output(out, expand):
    """`expand` applied to every tensor of the tower's output (a tensor, a list or tuple of them, or
    a ModelOutput), keeping its type."""
    if torch.is_tensor(out):
        return expand(out)
    if hasattr(out, "keys"):
        for key in list(out.keys()):
            out[key] = _map_output(out[key], expand)
        return out
    if isinstance(out, (list, tuple)):
        return type(out)(_map_output(x, expand) for x in out)
    return out
