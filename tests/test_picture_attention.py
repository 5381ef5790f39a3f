"""The vision tower's one-call attention gives what transformers' per-picture loop gives."""
import pytest
import torch

from envs.maze import MazeEnv
from vlm.picture_attention import batch_picture_attention


def vision_features(model, enc):
    out = model.model.visual(enc["pixel_values"], grid_thw=enc["image_grid_thw"])
    return out.pooler_output if hasattr(out, "pooler_output") else out[0]


@pytest.mark.parametrize("cells", [[16] * 6, [16, 16, 24]], ids=["one size", "two sizes"])
def test_one_call_equals_the_per_picture_loop(tiny_model_dir, monkeypatch, cells):
    from transformers import AutoModelForImageTextToText

    from vlm.processor import load_processor
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    processor = load_processor(tiny_model_dir)
    pictures = []
    for seed, px in enumerate(cells):
        env = MazeEnv(cell_px=px)
        env.reset(seed=seed)
        pictures.append(env.render())
    enc = processor.image_processor(images=pictures, return_tensors="pt")
    blocks = len(model.model.visual.blocks)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: (calls.append(a[0].shape[0]), sdpa(*a, **k))[1])
    with torch.no_grad():
        expected = vision_features(model, enc)
        assert len(calls) == blocks * len(pictures)  # transformers: one call a picture a block
        assert batch_picture_attention(model) == blocks
        calls.clear()
        got = vision_features(model, enc)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    if len(set(cells)) == 1:  # all pictures stacked: one call a block
        assert calls == [len(pictures)] * blocks
    else:  # pictures of two sizes keep transformers' path
        assert len(calls) == blocks * len(pictures)
