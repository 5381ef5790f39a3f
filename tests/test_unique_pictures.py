"""The vision tower encodes each distinct picture once and gives every copy its original's features."""
import pytest
import torch

from vlm.unique_pictures import distinct_pictures, encode_unique_pictures


def patches_of(pictures):
    """(patches, grid_thw) for pictures given as (h, w, fill) with one value a patch dimension."""
    rows, grids = [], []
    for h, w, fill in pictures:
        rows.append(fill.reshape(h * w, -1))
        grids.append([1, h, w])
    return torch.cat(rows), torch.tensor(grids)


def test_distinct_pictures_needs_equal_size_and_values():
    a, b = torch.arange(24.).reshape(4, 6), torch.arange(24.).reshape(4, 6)
    b_changed = b.clone()
    b_changed[3, 5] += 1e-3  # one value differs
    patches, grid = patches_of([(2, 2, a), (2, 2, b_changed), (2, 2, b), (1, 4, a), (2, 2, a)])
    unique, inverse = distinct_pictures(patches, grid)
    # 0, 2 and 4 are one picture; 1 differs in one value; 3 has a's values in another shape
    assert unique == [0, 1, 3]
    assert inverse == [0, 1, 0, 2, 0]


def test_equal_fingerprints_still_merge_only_equal_pictures(monkeypatch):
    import vlm.unique_pictures as up
    monkeypatch.setattr(up, "_fingerprints", lambda rows: [0] * len(rows))
    pics = [torch.full((4, 6), float(v)) for v in (1, 2, 1, 1)]
    unique, inverse = distinct_pictures(*patches_of([(2, 2, p) for p in pics]))
    # every picture's candidate is the first; only true copies of it merge, picture 1 stays apart
    assert unique == [0, 1] and inverse == [0, 1, 0, 0]


def maze_batch(processor, seeds):
    from envs.maze import MazeEnv
    pictures = []
    for seed in seeds:
        env = MazeEnv(cell_px=16)
        env.reset(seed=seed)
        pictures.append(env.render())
    return processor.image_processor(images=pictures, return_tensors="pt")


def tower_rows(model, enc, monkeypatch):
    """(the tower's output, how many pictures its patch embedding saw)."""
    seen = []
    embed = model.model.visual.patch_embed
    monkeypatch.setattr(embed, "forward", lambda x, f=embed.forward: (seen.append(x.shape[0]), f(x))[1])
    out = model.model.visual(enc["pixel_values"], grid_thw=enc["image_grid_thw"])
    monkeypatch.undo()
    return out, sum(seen) // int(enc["image_grid_thw"][0].prod())


def test_the_model_tower_encodes_copies_once_with_the_same_features(tiny_model_dir, monkeypatch):
    from transformers import AutoModelForImageTextToText

    from vlm.processor import load_processor
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    enc = maze_batch(load_processor(tiny_model_dir), [3, 5, 3, 3, 7, 5])
    with torch.no_grad():
        expected, encoded = tower_rows(model, enc, monkeypatch)
        assert encoded == 6
        assert encode_unique_pictures(model) == 1
        assert encode_unique_pictures(model) == 0  # wrapping twice would do nothing more
        got, encoded = tower_rows(model, enc, monkeypatch)
    assert encoded == 3
    assert type(got) is type(expected)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, atol=1e-6, rtol=1e-5)
    for g, e in zip(got.deepstack_features, expected.deepstack_features, strict=True):
        torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-5)


@pytest.fixture
def merging_tower():
    """A Qwen3-VL vision tower that merges 2 x 2 patches into one token, as the 2B and 8B do."""
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel
    torch.manual_seed(0)
    config = Qwen3VLVisionConfig(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=48,
                                 patch_size=4, spatial_merge_size=2, temporal_patch_size=1, in_channels=3,
                                 num_position_embeddings=16, deepstack_visual_indexes=[0])
    holder = torch.nn.Module()
    holder.visual = Qwen3VLVisionModel(config).eval()
    return holder


def test_merged_tokens_and_gradients_follow_the_copies(merging_tower):
    grid = torch.tensor([[1, 4, 4], [1, 4, 4], [1, 2, 4], [1, 4, 4]])
    pics = [torch.randn(16, 48), torch.randn(16, 48), torch.randn(8, 48)]
    patches = torch.cat([pics[0], pics[1], pics[2], pics[0]])
    tower = merging_tower.visual
    expected = tower(patches, grid_thw=grid)
    expected.pooler_output.square().sum().backward()
    grads = {n: p.grad.clone() for n, p in tower.named_parameters() if p.grad is not None}
    tower.zero_grad()

    assert encode_unique_pictures(merging_tower) == 1
    got = tower(patches, grid_thw=grid)
    assert got.pooler_output.shape == expected.pooler_output.shape == (4 + 4 + 2 + 4, 48)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.deepstack_features[0], expected.deepstack_features[0], atol=1e-6, rtol=1e-5)
    got.pooler_output.square().sum().backward()  # the copy's gradient reaches the weights through its original
    for name, p in tower.named_parameters():
        if name in grads:
            torch.testing.assert_close(p.grad, grads[name], atol=1e-5, rtol=1e-4)


def test_precomputed_per_picture_inputs_keep_the_towers_own_path(merging_tower, monkeypatch):
    import vlm.unique_pictures as up
    assert encode_unique_pictures(merging_tower) == 1
    monkeypatch.setattr(up, "distinct_pictures", lambda *a: pytest.fail("deduplicated despite precomputed inputs"))
    grid = torch.tensor([[1, 4, 4], [1, 4, 4]])
    pic = torch.randn(16, 48)
    cu_seqlens = torch.tensor([0, 16, 32], dtype=torch.int32)
    out = merging_tower.visual(torch.cat([pic, pic]), grid_thw=grid, cu_seqlens=cu_seqlens)
    assert out.pooler_output.shape == (8, 48)


def test_micro_batches_put_a_pictures_copies_together_and_keep_alike_lengths():
    import numpy as np

    from vlm.forward import TrainSeq, micro_batch_order
    picture = {v: np.full((4, 4, 3), v, dtype=np.uint8) for v in range(3)}
    # (length, picture): copies of pictures 0 and 1 interleaved at one length, a longer and a shorter one
    shapes = [(10, 0), (10, 1), (10, 0), (10, 1), (12, 2), (8, 0), (10, 0), (10, 1)]
    seqs = [TrainSeq("e", [1] * n, [0] * n, [0.0] * n, [picture[p].copy()]) for n, p in shapes]
    order = micro_batch_order(seqs)
    assert sorted(order) == list(range(len(seqs)))
    assert [shapes[i][0] for i in order] == [8, 10, 10, 10, 10, 10, 10, 12]  # lengths still ascend
    middle = [shapes[i][1] for i in order[1:7]]
    assert middle in ([0, 0, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0])  # in micro-batches of 3: one picture each


def test_the_patch_embedding_by_matmul_gives_the_convolutions_rows(tiny_model_dir):
    from transformers import AutoModelForImageTextToText

    from vlm.patch_embed import embed_patches_by_matmul
    from vlm.processor import load_processor
    model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    embed = model.model.visual.patch_embed
    enc = maze_batch(load_processor(tiny_model_dir), [3, 5])
    with torch.no_grad():
        expected = embed(enc["pixel_values"])
        assert embed_patches_by_matmul(model) == 1
        calls = []
        conv = embed.proj.forward
        embed.proj.forward = lambda x: (calls.append(x.shape), conv(x))[1]
        got = embed(enc["pixel_values"])
    assert calls == []  # the convolution no longer runs
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
