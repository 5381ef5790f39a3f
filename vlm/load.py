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


def local_model_folder(path: str) -> Path | None:
    """The existing folder `path` names (as given, or relative to the repository/install root)."""
    p = Path(path).expanduser()
    for candidate in ([p] if p.is_absolute() else [p, ROOT / p]):
        if candidate.is_dir():
            return candidate.resolve()
    return None


def model_source(path: str) -> str:
    """"local", "s3" or "hub" for a model path, without any download; a path that looks local but
    names no folder raises FileNotFoundError rather than being taken for a hub id."""
    if is_s3(path):
        return "s3"
    folder = local_model_folder(path)
    if folder is not None:
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"model folder '{path}' holds no config.json; point it at a saved "
                                    f"transformers model (config.json, *.safetensors, processor files)")
        return "local"
    head = Path(path).parts[0] if Path(path).parts else ""
    looks_local = (path.startswith((".", "/", "~")) or path.count("/") != 1
                   or (Path(head).is_dir() or (ROOT / head).is_dir()))
    if looks_local:
        raise FileNotFoundError(f"model path '{path}' does not exist: no such folder here or under {ROOT}; "
                                f"give a model folder, an s3://bucket/prefix or a Hugging Face id (org/name)")
    return "hub"


# What the head needs of a model to build prompts: the processor's and tokenizer's files, not the weights.
PROCESSOR_FILES = ("*.json", "*.txt", "*.jinja", "*.model", "tokenizer*")


def resolve_model_path(path: str, s3_cfg=None, cache_dir: Path | None = None, weights: bool = True) -> str:
    """A local folder holding the model: the path itself, or a cached download of it. With
    `weights=False` only the processor's files are fetched (the driver on a head node builds prompts
    and never loads the model: an 8B repository is 17 GB)."""
    import fnmatch
    cache_dir = Path(cache_dir or DEFAULT_CACHE)
    kind = model_source(path)
    if kind == "local":
        return str(local_model_folder(path))
    what = "SFT checkpoint" if weights else "processor files of"
    if kind == "s3":
        dest = cache_dir / ("s3" if weights else "s3-processor") / hashlib.sha256(path.encode()).hexdigest()[:16]
        if not (dest / ".complete").exists():
            print(f"=== Downloading {what} === {path} -> {dest}", flush=True)
            wanted = None if weights else (lambda rel: any(fnmatch.fnmatch(Path(rel).name, p) for p in PROCESSOR_FILES))
            open_store(path, s3_cfg).download_dir("", str(dest), only=wanted)
            (dest / ".complete").touch()
        return str(dest)
    from huggingface_hub import snapshot_download
    print(f"=== Downloading {what} === {path} (Hugging Face)", flush=True)
    return snapshot_download(path, cache_dir=str(cache_dir / "hf"), endpoint=os.environ.get("HF_ENDPOINT") or None,
                             allow_patterns=None if weights else list(PROCESSOR_FILES))


def load_model(path: str, device: str = "cpu", dtype: torch.dtype = torch.float32, s3_cfg=None,
               speedups: bool = True):
    """(model in eval mode on `device`, processor) from any supported source. With `speedups` (the
    config's trainer.policy.model.speedups) the vision tower encodes each distinct picture of a batch
    once (vlm/unique_pictures.py), embeds its patches with one matrix product (vlm/patch_embed.py)
    and attends over all of them in one call (vlm/picture_attention.py), RMSNorms run fused on the
    GPU (vlm/fused_norms.py) and the rotary index is computed in numpy (vlm/rope_index.py);
    without, transformers' code runs as it is."""
    from vlm.fused_norms import fuse_rms_norms
    from vlm.patch_embed import embed_patches_by_matmul
    from vlm.picture_attention import batch_picture_attention
    from vlm.rope_index import vectorize_rope_index
    from vlm.unique_pictures import encode_unique_pictures
    folder = resolve_model_path(path, s3_cfg)
    if torch.device(device).type == "cuda":
        # cuDNN's attention builds an execution plan for every new shape, and every turn and
        # micro-batch brings new lengths: on a GPU that planning was a third of a rollout of the CPU
        # default's model (bench/record/). The flash and memory-efficient kernels plan nothing. (The graph decode's
        # fixed shapes keep cuDNN: inference/graph_decode.py.)
        torch.backends.cuda.enable_cudnn_sdp(False)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype).to(device).eval()
    if speedups:
        patched = {patch.__name__: patch(model) for patch in
                   (batch_picture_attention, encode_unique_pictures, embed_patches_by_matmul, fuse_rms_norms,
                    vectorize_rope_index)}
        check_patched(model, patched)
    return model, load_processor(folder)


class PatchError(RuntimeError):
    """A speed-up patch found nothing to patch: transformers renamed what it replaces."""


def check_patched(model, patched: dict) -> None:
    """Every patch must have found its modules in a Qwen-VL model: one that matched nothing means the
    installed transformers renamed a class or method, and the run would be slower (or, for the
    rotary positions, differ) without a word. Other architectures get the patches that fit."""
    import transformers
    missing = sorted(name for name, count in patched.items() if count == 0)
    if missing and str(getattr(model.config, "model_type", "")).startswith("qwen"):
        raise PatchError(f"{', '.join(missing)} matched no module of {type(model).__name__} under transformers "
                         f"{transformers.__version__}: install the tested versions (pip install -c requirements/lock.txt "
                         f"...) or update vlm/ for this release")


def resolve_device(device: str) -> str:
    """trainer.device: "auto" is cuda where a GPU is visible, else cpu."""
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def compute_dtype(device: str) -> str:
    """The weights' dtype on a device: bf16 on a GPU; fp32 on the CPU, where bf16 matmuls are slow."""
    return "bfloat16" if device == "cuda" else "float32"


def peak_memory_gib() -> float:
    """This process's peak GPU memory (the caching allocator's high-water mark); 0 without a GPU."""
    return torch.cuda.max_memory_allocated() / 2 ** 30 if torch.cuda.is_available() else 0.0


def release_cached_memory(device: str) -> None:
    """Hand the caching allocator's free blocks back to the GPU, so the colocated actor whose phase
    comes next can use them (the allocator keeps a phase's activations otherwise)."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
