"""The image processor's output for each distinct picture, computed once.

A rollout shows every earlier picture again in each later turn it stays in context: with all
pictures kept, an episode of T turns has T(T+1)/2 pictures preprocessed for T distinct ones (5
turns: 15 for 5; the reference config's 15 turns: 120 for 15). The processor's output depends on
the picture alone, so it is kept, keyed by the picture's bytes, and reused. With
`generator.context_pictures=1` no picture is shown twice, and the engine keeps none (max_bytes 0).
The policy shard keeps one as well: a step's passes (reference, old policy, each update epoch)
show the same pictures.

The processor itself works one picture at a time in numpy (rescale in float64, normalise in
float32, patchify with a temporal copy): ~1-2 ms a small picture, most of a rollout's host time on
a GPU. For uint8 RGB pictures it does not resize (the maze renders are drawn at a multiple of the
patch size), its output for a pixel depends only on the value and the channel, so `PatchTable`
computes those 256 x 3 numbers once with the processor's own rescale and normalize and patchifies
a whole batch by lookup: the same numbers, bit for bit (tests/test_pictures.py). Anything else
goes to the processor.
"""
from __future__ import annotations

import hashlib
import sys
from collections import OrderedDict

import numpy as np
import torch

_SAME_SIZE_INTS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


class PatchTable:
    """The Qwen2-VL image processor (PIL or slow numpy backend) as a lookup, for uint8 RGB pictures
    it keeps at their size; `__call__` gives None for any other batch."""

    def __init__(self, image_processor, dtype: torch.dtype):
        p = self.processor = image_processor
        self.patch, self.merge, self.temporal = p.patch_size, p.merge_size, p.temporal_patch_size
        values = np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 1, 256)).copy()  # channels first, as p holds one
        if p.do_rescale:
            values = p.rescale(values, p.rescale_factor)
        if p.do_normalize:
            values = p.normalize(values, p.image_mean, p.image_std)
        table = torch.from_numpy(np.asarray(values, dtype=np.float32)[:, 0].copy()).to(dtype)
        # numpy has no bfloat16: the lookup moves the values' bits as integers of the same width
        self.int_dtype, self.dtype = _SAME_SIZE_INTS[table.element_size()], dtype
        self.bits = table.view(self.int_dtype).numpy().reshape(-1)  # [channel * 256 + value]

    @staticmethod
    def mirrors(image_processor) -> bool:
        """Whether this is a processor whose arithmetic the table reproduces."""
        p = image_processor
        return (type(p).__name__ in ("Qwen2VLImageProcessor", "Qwen2VLImageProcessorPil")
                and getattr(p, "backend", "pil") == "pil" and getattr(p, "do_convert_rgb", True) is not False)

    def keeps_size(self, height: int, width: int) -> bool:
        smart_resize = sys.modules[type(self.processor).__module__].smart_resize  # the one the processor calls
        if not self.processor.do_resize:
            return height % (self.patch * self.merge) == 0 and width % (self.patch * self.merge) == 0
        size = self.processor.size
        return smart_resize(height, width, factor=self.patch * self.merge, min_pixels=size["shortest_edge"],
                            max_pixels=size["longest_edge"]) == (height, width)

    def __call__(self, pictures: list) -> dict | None:
        first = pictures[0]
        if not all(isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.shape == first.shape for x in pictures):
            return None
        if first.ndim != 3 or first.shape[2] != 3 or not self.keeps_size(*first.shape[:2]):
            return None
        count, height, width, channels = len(pictures), *first.shape
        P, m, T = self.patch, self.merge, self.temporal
        gh, gw = height // P, width // P
        # the processor's patch order: (picture, gh/m, gw/m, m, m, channel, P, P), then T copies in time
        pixels = np.stack(pictures).reshape(count, gh // m, m, P, gw // m, m, P, channels)
        index = pixels.transpose(0, 1, 4, 2, 5, 7, 3, 6).astype(np.int16)
        index += (np.arange(channels, dtype=np.int16) * 256)[:, None, None]
        values = self.bits[index][:, :, :, :, :, :, None]
        values = np.broadcast_to(values, (*values.shape[:6], T, P, P))
        patches = torch.from_numpy(values.reshape(count * gh * gw, channels * T * P * P)).view(self.dtype)
        return {"pixel_values": patches, "image_grid_thw": torch.tensor([[1, gh, gw]] * count, dtype=torch.int64)}


class PicturePreprocessor:
    def __init__(self, image_processor, dtype: torch.dtype = torch.float32, max_bytes: int = 1 << 30):
        self.image_processor, self.dtype, self.max_bytes = image_processor, dtype, max_bytes
        self.table = PatchTable(image_processor, dtype) if PatchTable.mirrors(image_processor) else None
        self._kept: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._bytes = 0
        self.processed = 0  # pictures that went through the image processor

    @staticmethod
    def key(picture) -> bytes:
        array = np.ascontiguousarray(np.asarray(picture))
        digest = hashlib.sha256(repr((array.shape, array.dtype.str)).encode())  # sha256: ~2x blake2b with SHA-NI
        digest.update(memoryview(array).cast("B"))
        return digest.digest()

    def __call__(self, pictures: list, device: torch.device | str | None = None) -> dict:
        """{"pixel_values" (in `dtype`, on `device`), "image_grid_thw"} for the pictures, in order, as the
        processor gives them. Each distinct picture's values cross to the device once, and the
        repeats are copied there: a rollout's turn shows the same start picture to a whole group."""
        keys = [self.key(p) for p in pictures]
        distinct = list(dict.fromkeys(keys))  # in order of first appearance
        found = {k: self._kept[k] for k in distinct if k in self._kept}
        new = [k for k in distinct if k not in found]
        unique = None
        if new:
            picture = dict(zip(reversed(keys), reversed(pictures)))  # a key's first picture
            enc = self._process([picture[k] for k in new])
            rows = enc["image_grid_thw"].prod(-1).tolist()
            for k, values, grid in zip(new, enc["pixel_values"].split(rows), enc["image_grid_thw"]):
                found[k] = (values, grid)
                self._keep(k, values, grid)
            self.processed += len(new)
            if len(new) == len(distinct):
                unique = enc["pixel_values"]  # already one block in `distinct` order
        for k in distinct:
            if k in self._kept:
                self._kept.move_to_end(k)
        if unique is None:
            unique = torch.cat([found[k][0] for k in distinct])
        if device is not None:
            unique = unique.to(device)
        grids = torch.stack([found[k][1] for k in keys])
        if len(distinct) == len(keys):
            return {"pixel_values": unique, "image_grid_thw": grids}
        slot = {k: i for i, k in enumerate(distinct)}
        rows = torch.tensor([found[k][0].shape[0] for k in distinct])
        which = torch.tensor([slot[k] for k in keys])
        counts = rows[which]
        # row r of the output is row (r - where its picture starts in the output) of its picture in `unique`
        shift = torch.repeat_interleave((rows.cumsum(0) - rows)[which] - (counts.cumsum(0) - counts), counts)
        index = shift + torch.arange(len(shift))
        return {"pixel_values": unique.index_select(0, index.to(unique.device)), "image_grid_thw": grids}

    def _process(self, pictures: list) -> dict:
        enc = self.table(pictures) if self.table is not None else None
        if enc is None:
            enc = self.image_processor(images=pictures, return_tensors="pt")
            enc = {"pixel_values": enc["pixel_values"].to(self.dtype), "image_grid_thw": enc["image_grid_thw"]}
        return enc

    def _keep(self, key: bytes, values: torch.Tensor, grid: torch.Tensor) -> None:
        size = values.numel() * values.element_size()
        if size > self.max_bytes:
            return
        self._kept[key] = (values, grid)
        self._bytes += size
        while self._bytes > self.max_bytes:  # least recently used first
            _, (old, _) = self._kept.popitem(last=False)
            self._bytes -= old.numel() * old.element_size()
