"""The image processor's output for each distinct picture, computed once.

A rollout shows every earlier picture again in each later turn it stays in context: with all
pictures kept, an episode of T turns has T(T+1)/2 pictures preprocessed for T distinct ones (5
turns: 15 for 5; the reference config's 15 turns: 120 for 15). The processor's output depends on
the picture alone, so it is kept, keyed by the picture's bytes, and reused. With
`generator.context_pictures=1` no picture is shown twice, and the engine keeps none (max_bytes 0).
The policy shard keeps one as well: a step's passes (reference, old policy, each update epoch)
show the same pictures.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np
import torch


class PicturePreprocessor:
    def __init__(self, image_processor, dtype: torch.dtype = torch.float32, max_bytes: int = 1 << 30):
        self.image_processor, self.dtype, self.max_bytes = image_processor, dtype, max_bytes
        self._kept: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._bytes = 0
        self.processed = 0  # pictures that went through the image processor

    @staticmethod
    def key(picture) -> bytes:
        array = np.ascontiguousarray(np.asarray(picture))
        digest = hashlib.blake2b(repr((array.shape, array.dtype.str)).encode(), digest_size=16)
        digest.update(memoryview(array).cast("B"))
        return digest.digest()

    def __call__(self, pictures: list) -> dict:
        """{"pixel_values" (in `dtype`), "image_grid_thw"} for the pictures, in order, as the processor gives them."""
        keys = [self.key(p) for p in pictures]
        new = {}
        for k, picture in zip(keys, pictures):
            if k not in self._kept and k not in new:
                new[k] = picture
        found = {k: self._kept[k] for k in keys if k in self._kept}
        if new:
            enc = self.image_processor(images=list(new.values()), return_tensors="pt")
            rows = enc["image_grid_thw"].prod(-1).tolist()
            for k, values, grid in zip(new, enc["pixel_values"].to(self.dtype).split(rows), enc["image_grid_thw"]):
                found[k] = (values, grid)
                self._keep(k, values, grid)
            self.processed += len(new)
        for k in found:
            if k in self._kept:
                self._kept.move_to_end(k)
        return {"pixel_values": torch.cat([found[k][0] for k in keys]),
                "image_grid_thw": torch.stack([found[k][1] for k in keys])}

    def _keep(self, key: bytes, values: torch.Tensor, grid: torch.Tensor) -> None:
        size = values.numel() * values.element_size()
        if size > self.max_bytes:
            return
        self._kept[key] = (values, grid)
        self._bytes += size
        while self._bytes > self.max_bytes:  # least recently used first
            _, (old, _) = self._kept.popitem(last=False)
            self._bytes -= old.numel() * old.element_size()
