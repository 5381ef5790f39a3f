"""Load a vision-language model and its processor from a local folder, s3:// or a Hugging Face id.

Remote sources are downloaded once into a local cache and loaded from there. Qwen3-VL, Qwen2.5-VL
and Qwen2-VL checkpoints load through transformers' auto classes; the processor comes from
vlm.processor so it works with and without torchvision.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText

from storage import is_s3, open_store
from vlm.processor import load_processor

DEFAULT_CACHE = Path(os.environ.get("VISRL_CACHE", Path.home() / ".cache" / "visrl"))
ROOT = Path(__file__).resolve().parent.parent


def resolve_model_path(path: str, s3_cfg=None, cache_dir: Path | None = None) -> str:
    """A local folder holding the model: the path itself, or a cached download of it."""
    cache_dir = Path(cache_dir or DEFAULT_CACHE)
    local = Path(path) if Path(path).is_absolute() else ROOT / path
    if not is_s3(path) and local.is_dir():
        return str(local)
    if is_s3(path):
        dest = cache_dir / "s3" / hashlib.sha256(path.encode()).hexdigest()[:16]
        if not (dest / ".complete").exists():
            print(f"=== Downloading SFT checkpoint === {path} -> {dest}", flush=True)
            open_store(path, s3_cfg).download_dir("", str(dest))
            (dest / ".complete").touch()
        return str(dest)
    if path.count("/") == 1 and not path.startswith((".", "/")):
        from huggingface_hub import snapshot_download
        print(f"=== Downloading SFT checkpoint === {path} (Hugging Face)", flush=True)
        return snapshot_download(path, cache_dir=str(cache_dir / "hf"),
                                 endpoint=os.environ.get("HF_ENDPOINT") or None)
    raise FileNotFoundError(f"model path '{path}' is not a folder, an s3:// prefix or a Hugging Face id "
                            f"(org/name); check trainer.policy.model.path")


def load_model(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32, s3_cfg=None):
    """(model in eval mode on `device`, processor) from any supported source."""
    folder = resolve_model_path(path, s3_cfg)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype).to(device).eval()
    return model, load_processor(folder)
