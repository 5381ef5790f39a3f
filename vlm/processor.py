"""Qwen-VL processors that work with and without torchvision.

transformers' Qwen3-VL processor always builds a video processor, and video processors need
torchvision. The CPU default has no torchvision (the only wheels here need CUDA and break the
processors), so there we use a subclass that handles images only and the PIL image backend.
With torchvision installed (GPU boxes) the stock AutoProcessor is used.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from transformers import AutoProcessor, Qwen3VLProcessor
from transformers.processing_utils import ProcessorMixin


def has_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


class ImageOnlyQwen3VLProcessor(Qwen3VLProcessor):
    """Qwen3VLProcessor without the video processor (images and text only).

    Saved, it also writes a video processor config of the same patch geometry. visrl never reads
    it; vLLM builds the stock Qwen3VLProcessor for this architecture, which insists on one.
    """

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token = getattr(tokenizer, "image_token", "<|image_pad|>")
        self.video_token = getattr(tokenizer, "video_token", "<|video_pad|>")
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)
        self.vision_start_token = getattr(tokenizer, "vision_start_token", "<|vision_start|>")
        self.vision_end_token = getattr(tokenizer, "vision_end_token", "<|vision_end|>")
        self.vision_start_token_id = tokenizer.convert_tokens_to_ids(self.vision_start_token)
        self.vision_end_token_id = tokenizer.convert_tokens_to_ids(self.vision_end_token)
        ProcessorMixin.__init__(self, image_processor, tokenizer, chat_template=chat_template, **kwargs)


    def save_pretrained(self, save_directory, *args, **kwargs):
        out = super().save_pretrained(save_directory, *args, **kwargs)
        image = self.image_processor
        video = {"video_processor_type": "Qwen3VLVideoProcessor", "patch_size": image.patch_size,
                 "merge_size": image.merge_size, "temporal_patch_size": image.temporal_patch_size}
        (Path(save_directory) / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2) + "\n")
        return out


def load_processor(path: str):
    """The processor saved beside a model, usable on this machine.

    The embedded base saves an ImageOnlyQwen3VLProcessor, which AutoProcessor does not know (it
    would quietly return the bare tokenizer), so that class is loaded directly, with the PIL
    image backend everywhere so pixels match bit for bit between CPU and GPU machines. Real
    Qwen-VL checkpoints go through AutoProcessor when torchvision is there.
    """
    saved = Path(path) / "processor_config.json"
    ours = saved.exists() and json.loads(saved.read_text()).get("processor_class") == ImageOnlyQwen3VLProcessor.__name__
    if has_torchvision() and not ours:
        processor = AutoProcessor.from_pretrained(path)
        if hasattr(processor, "image_processor"):
            return processor
    return ImageOnlyQwen3VLProcessor.from_pretrained(path, backend="pil")
