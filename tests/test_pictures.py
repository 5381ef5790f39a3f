"""Each distinct picture goes through the image processor once; what comes back is what the
processor gives for the whole list."""
import pytest
import torch

from actors.vllm_engine import engine_settings
from envs.maze import MazeEnv
from inference.pictures import PicturePreprocessor
from settings.load import load_config
from vlm.processor import load_processor


def pictures(seeds):
    return [MazeEnv(cell_px=16).reset(seed=s)[0] for s in seeds]


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_repeated_pictures_are_processed_once_and_match_the_processor(tiny_model_dir, device):
    image_processor = load_processor(tiny_model_dir).image_processor
    shown = pictures([1, 2, 1, 3, 2, 1])  # a later turn shows earlier pictures again
    cache = PicturePreprocessor(image_processor)
    first = cache(shown[:3])
    again = cache(shown, device)  # 1 and 2 from the cache, 3 new
    direct = image_processor(images=shown, return_tensors="pt")
    assert cache.processed == 3
    assert again["pixel_values"].device.type == device
    assert torch.equal(again["pixel_values"].cpu(), direct["pixel_values"])
    assert torch.equal(again["image_grid_thw"], direct["image_grid_thw"])
    assert torch.equal(first["pixel_values"], again["pixel_values"][:len(first["pixel_values"])].cpu())
    fresh = PicturePreprocessor(image_processor, max_bytes=0)(shown, device)  # all new, repeats among them
    assert torch.equal(fresh["pixel_values"].cpu(), direct["pixel_values"])


def test_a_full_cache_forgets_the_least_recently_used_picture(tiny_model_dir):
    image_processor = load_processor(tiny_model_dir).image_processor
    a, b, c = pictures([1, 2, 3])
    one = image_processor(images=[a], return_tensors="pt")["pixel_values"]
    cache = PicturePreprocessor(image_processor, max_bytes=2 * one.numel() * one.element_size())
    cache([a, b])
    cache([a])  # a is now the most recently used
    cache([c])  # evicts b
    assert cache.processed == 3
    cache([a, c])
    assert cache.processed == 3
    cache([b])
    assert cache.processed == 4


def test_the_same_pixels_in_another_shape_are_another_picture(tiny_model_dir):
    cache = PicturePreprocessor(load_processor(tiny_model_dir).image_processor)
    a = pictures([1])[0]
    assert cache.key(a) != cache.key(a.reshape(a.shape[0] * 2, a.shape[1] // 2, 3))  # same bytes
    assert cache.key(a) == cache.key(a.copy())
    assert cache.key(a) != cache.key(pictures([2])[0])


@pytest.mark.parametrize("pictures_kept, cache_bytes", [(1, 0), (0, 1 << 30), (2, 1 << 30)])
def test_the_engine_keeps_pictures_only_where_a_prompt_can_show_one_again(pictures_kept, cache_bytes):
    cfg = load_config("configs/default.yaml", [f"generator.context_pictures={pictures_kept}"])
    assert engine_settings(cfg)["picture_cache_bytes"] == cache_bytes


def test_a_cache_of_no_bytes_keeps_nothing_and_gives_the_same_output(tiny_model_dir):
    image_processor = load_processor(tiny_model_dir).image_processor
    shown = pictures([1, 2, 1])
    cache = PicturePreprocessor(image_processor, max_bytes=0)
    out = cache(shown)
    cache(shown)
    assert cache.processed == 4 and not cache._kept
    assert torch.equal(out["pixel_values"], image_processor(images=shown, return_tensors="pt")["pixel_values"])


@pytest.mark.parametrize("merge, side, dtype", [(1, 144, torch.float32), (2, 64, torch.float32), (2, 96, torch.bfloat16)])
def test_the_patch_table_gives_the_processors_numbers_bit_for_bit(tiny_model_dir, merge, side, dtype):
    import copy

    import numpy as np
    image_processor = copy.deepcopy(load_processor(tiny_model_dir).image_processor)
    image_processor.merge_size = merge  # 2: Qwen3-VL's, picture sides a multiple of 32
    rng = np.random.default_rng(0)
    shown = [rng.integers(0, 256, (side, side, 3), dtype=np.uint8) for _ in range(3)]  # every value, every channel
    if side == 144:
        shown += pictures([1, 2])
    cache = PicturePreprocessor(image_processor, dtype)
    assert cache.table is not None
    out = cache(shown)
    direct = image_processor(images=shown, return_tensors="pt")
    assert out["pixel_values"].dtype == dtype
    assert torch.equal(out["pixel_values"], direct["pixel_values"].to(dtype))
    assert torch.equal(out["image_grid_thw"], direct["image_grid_thw"])


def test_pictures_the_processor_resizes_go_to_the_processor(tiny_model_dir):
    import numpy as np
    image_processor = load_processor(tiny_model_dir).image_processor
    cache = PicturePreprocessor(image_processor)
    odd = [np.random.default_rng(1).integers(0, 256, (150, 120, 3), dtype=np.uint8)]  # not a multiple of 16
    assert not cache.table.keeps_size(150, 120) and cache.table(odd) is None
    assert cache.table(pictures([1]) + odd) is None  # a batch of mixed sizes as well
    out = cache(odd + pictures([1]))
    direct = image_processor(images=odd + pictures([1]), return_tensors="pt")
    assert torch.equal(out["pixel_values"], direct["pixel_values"]) and cache.processed == 2
