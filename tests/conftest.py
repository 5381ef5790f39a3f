"""Shared fixtures: a tiny random Qwen3-VL-shaped model saved to disk, built once per session."""
import os

import pytest
import torch

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # Ray 2.60 turns dashboard token auth on by default
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

TINY = dict(text_hidden=32, text_layers=1, text_heads=2, text_kv_heads=1, text_intermediate=64,
            vision_hidden=32, vision_layers=2, vision_heads=2, vision_intermediate=64)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from vlm.build import EmbeddedArch, build_random_base
    out = tmp_path_factory.mktemp("tiny-model")
    model, processor = build_random_base(EmbeddedArch(**TINY), seed=0)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return str(out)
