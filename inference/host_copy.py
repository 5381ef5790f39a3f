"""The page-locked host copy of a model's weights that a colocated actor keeps while it lends its GPU
to the other (the hf engine asleep while the shards train, a policy shard offloaded while the engines
generate): made once, since the weights it holds never change, and read back at pinned-memory speed."""
from __future__ import annotations

import torch


def pinned_copies(params) -> dict:
    """{parameter: a page-locked host copy of its data}, the copies complete on return."""
    copies = {p: torch.empty(p.shape, dtype=p.dtype, pin_memory=True).copy_(p.data, non_blocking=True) for p in params}
    torch.cuda.synchronize()
    return copies
