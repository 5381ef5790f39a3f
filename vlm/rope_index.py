"""Qwen-VL's 3-D rotary positions computed once a row with numpy, not token group by token group.

transformers' `get_rope_index` walks each row of a batch in Python: it groups the row's token
types with itertools, builds each group's positions with small torch ops and reads values back
with `.item()` and `.tolist()`, each a device sync on a GPU. A train pass of the CPU default on an
H200 spent 1.5 of its 3.3 s there (1,004 rows), the GPU busy 4% of the time. This computes the same
positions from three small host copies (token types, attention mask, picture grids) with numpy and
sends them to the device once. Videos, and masks other than 2-D, keep transformers' path. The
result is the same integers, so every figure stays bitwise the same (tests/test_rope_index.py).
"""
from __future__ import annotations

import numpy as np
import torch

from vlm.patching import replace_method


def vectorize_rope_index(model) -> int:
    """Give every Qwen-VL inner model of `model` (a `get_rope_index` and a vision config) the
    numpy version; returns how many."""
    return replace_method(model, "get_rope_index", lambda _, m: hasattr(m, "get_rope_index") and hasattr(
        getattr(m, "config", None), "vision_config"), _rope_index)


def _rope_index(transformers_rope_index, module):
    def get_rope_index(self, input_ids, mm_token_type_ids=None, image_grid_thw=None, video_grid_thw=None,
                       attention_mask=None, **kwargs):
        if (video_grid_thw is not None or mm_token_type_ids is None or image_grid_thw is None
                or (attention_mask is not None and attention_mask.dim() != 2)):
            return transformers_rope_index(self, input_ids, mm_token_type_ids, image_grid_thw=image_grid_thw,
                                           video_grid_thw=video_grid_thw, attention_mask=attention_mask, **kwargs)
        kinds = mm_token_type_ids.cpu().numpy()
        keep = np.ones(kinds.shape, bool) if attention_mask is None else attention_mask.bool().cpu().numpy()
        positions, deltas = rope_positions(kinds, keep, image_grid_thw.cpu().numpy(),
                                           self.config.vision_config.spatial_merge_size)
        return (torch.from_numpy(positions).to(device=input_ids.device, dtype=input_ids.dtype),
                torch.from_numpy(deltas).to(input_ids.device).unsqueeze(1))
    return get_rope_index


def rope_positions(kinds: np.ndarray, keep: np.ndarray, grids: np.ndarray, merge: int):
    """(positions (3, B, L), deltas (B,)) as transformers' get_rope_index gives them for pictures:
    the kept tokens of a row, in order, form runs of one kind; a text run counts on from the last
    position in all three axes, a picture run (the next grid of `grids`) takes start + (t, row, col)
    of its merged grid and moves the start on by its larger side. Padding stays 0; a row's delta is
    its largest position + 1 minus its kept length."""
    positions = np.zeros((3,) + kinds.shape, np.int64)
    deltas = np.zeros(kinds.shape[0], np.int64)
    next_grid = 0
    for b in range(kinds.shape[0]):
        row = kinds[b][keep[b]]
        bounds = np.flatnonzero(np.diff(row)) + 1
        pos = np.empty((3, len(row)), np.int64)
        start = 0
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(row)]):
            if row[lo] == 0:
                pos[:, lo:hi] = np.arange(hi - lo) + start
                start += hi - lo
            else:
                t, h, w = (int(v) for v in grids[next_grid])
                next_grid += 1
                h, w = h // merge, w // merge
                grid = np.indices((t, h, w)).reshape(3, -1)
                if grid.shape[1] != hi - lo:
                    raise ValueError(f"row {b}: a picture run of {hi - lo} tokens against a grid of {grid.shape[1]}")
                pos[:, lo:hi] = grid + start
                start += max(h, w)
        positions[:, b, keep[b]] = pos
        deltas[b] = (pos.max() + 1 if len(row) else 0) - len(row)
    return positions, deltas
