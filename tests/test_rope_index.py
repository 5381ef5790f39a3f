"""The numpy 3-D rotary positions equal transformers' get_rope_index, and the model's outputs stay the same."""
import numpy as np
import pytest
import torch

from vlm.rope_index import rope_positions, vectorize_rope_index


def transformers_positions(inner, kinds, keep, grids):
    """transformers' own get_rope_index (the class's, never the patched one) on the same inputs."""
    ids = torch.ones(kinds.shape, dtype=torch.long)
    return type(inner).get_rope_index(inner, ids, torch.from_numpy(kinds), image_grid_thw=torch.tensor(grids),
                                      attention_mask=None if keep is None else torch.from_numpy(keep).long())


def row(*runs):
    """Token kinds of one row from (kind, length) runs."""
    return np.concatenate([np.full(n, k, np.int64) for k, n in runs])


@pytest.fixture(scope="module")
def inner(tiny_model_dir):
    from transformers import AutoModelForImageTextToText
    return AutoModelForImageTextToText.from_pretrained(tiny_model_dir).model


def test_positions_match_transformers_for_padded_rows_and_several_pictures(inner):
    merge = inner.config.vision_config.spatial_merge_size
    # pictures of (t, h, w) patches: square, wide, tall, and a two-frame one
    grids = [[1, 2 * merge, 2 * merge], [1, 2 * merge, 3 * merge], [1, 3 * merge, merge], [2, merge, 2 * merge],
             [1, 2 * merge, 2 * merge]]
    rows = [row((0, 5), (1, 4), (0, 3)),                  # one picture
            row((0, 2), (1, 6), (0, 4), (1, 3), (0, 2)),  # two pictures of different shapes
            row((1, 4), (0, 7)),                          # a two-frame picture first, then text
            row((0, 3), (1, 4), (0, 2)),
            row((0, 9))]                                  # text only
    width = max(len(r) for r in rows) + 3
    kinds = np.zeros((len(rows), width), np.int64)
    keep = np.zeros_like(kinds, dtype=bool)
    for b, r in enumerate(rows):
        lo = 3 if b % 2 else 0  # odd rows left-padded, even rows right-padded
        kinds[b, lo:lo + len(r)], keep[b, lo:lo + len(r)] = r, True
    want_pos, want_delta = transformers_positions(inner, kinds, keep, grids)
    pos, delta = rope_positions(kinds, keep, np.array(grids), merge)
    assert np.array_equal(pos, want_pos.numpy()) and np.array_equal(delta, want_delta.squeeze(1).numpy())
    # without a mask every token is kept
    full = np.stack([row((0, 4), (1, 4), (0, 2)), row((0, 1), (1, 4), (0, 5))])
    want_pos, want_delta = transformers_positions(inner, full, None, grids[:1] + grids[-1:])
    pos, delta = rope_positions(full, np.ones(full.shape, bool), np.array(grids[:1] + grids[-1:]), merge)
    assert np.array_equal(pos, want_pos.numpy()) and np.array_equal(delta, want_delta.squeeze(1).numpy())
    assert pos[1, 1, 3] != pos[2, 1, 3]  # not text-like: a picture's rows and columns differ


def test_a_picture_run_that_does_not_fit_its_grid_is_an_error():
    with pytest.raises(ValueError, match="picture run of 3 tokens against a grid of 4"):
        rope_positions(row((0, 2), (1, 3))[None], np.ones((1, 5), bool), np.array([[1, 4, 4]]), 2)


def test_the_patched_model_gives_the_same_logits(tiny_model_dir, prompter, monkeypatch):
    from transformers import AutoModelForImageTextToText

    import vlm.rope_index
    from envs.maze import MazeEnv
    from vlm.forward import TrainSeq, collate
    from vlm.processor import load_processor
    processor = load_processor(tiny_model_dir)
    seqs = []
    for seed, turns in ((0, 1), (1, 3)):  # one picture; three turns with a picture each (unequal lengths)
        env = MazeEnv(cell_px=16)
        env.reset(seed=seed)
        ids, with_pictures = prompter.prompt(["go"] * turns, [[11, 12]] * (turns - 1))
        seqs.append(TrainSeq(f"e{seed}", ids, [0] * len(ids), [0.0] * len(ids), [env.render()] * len(with_pictures)))
    batch = collate(seqs, processor, "cpu")
    inputs = {k: v for k, v in batch.items() if k != "loss_mask"}
    plain = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    patched = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).eval()
    assert vectorize_rope_index(patched) == 1 and vectorize_rope_index(patched) == 0  # once only
    calls = []
    monkeypatch.setattr(vlm.rope_index, "rope_positions", lambda *a, f=rope_positions: (calls.append(1), f(*a))[1])
    with torch.no_grad():
        want, got = plain(**inputs).logits, patched(**inputs).logits
    assert calls == [1]  # the numpy path ran, once, for the patched model only
    assert torch.equal(want, got)
