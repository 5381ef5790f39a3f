"""Qwen3-VL's own picture preprocessing, from its published settings.

Qwen3-VL-8B-Instruct's preprocessor: patches of 16 pixels, 2 x 2 patches merged into one picture
token, pictures repeated over 2 temporal patches, pixels scaled to [-1, 1] (mean and std 0.5), and
each picture resized (to multiples of 32 pixels a side) to between 65,536 and 16,777,216 pixels. The
8B shape the benchmarks build uses it, so its prompts carry as many picture tokens as the real
model's. Its tokenizer and chat template are not here (docs/cluster.md says where they were looked for).
"""
from __future__ import annotations

PATCH, MERGE, TEMPORAL = 16, 2, 2
MIN_PIXELS, MAX_PIXELS = 65_536, 16_777_216
MEAN = STD = (0.5, 0.5, 0.5)


def image_processor():
    """transformers' Qwen2-VL image processor (which Qwen3-VL uses) with Qwen3-VL's settings, on the
    PIL backend (no torchvision needed)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    return Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL,
                                    image_mean=list(MEAN), image_std=list(STD),
                                    size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS})


def picture_tokens(height: int, width: int) -> int:
    """How many picture tokens Qwen3-VL gives a picture of this size."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize
    h, w = smart_resize(height, width, factor=PATCH * MERGE, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    return (h // PATCH) * (w // PATCH) // (MERGE * MERGE)
