"""Mini-batches count prompts; token weights give token_mean / sequence_mean over a mini-batch."""
import numpy as np

from rl.batch import build_items, split_for_ranks
from rl.rollout import Episode, Turn


def episode(eid, group, answers, reward):
    ep = Episode(eid, group, None, reward=reward)
    for k, n in enumerate(answers):
        ep.images.append(np.zeros((2, 2, 3), np.uint8))
        ep.turns.append(Turn([1, 2, 3], list(range(10, 10 + n)), [-0.1] * n, [k], "x"))
    return ep


def test_weights_sum_to_one_per_minibatch_for_both_reductions():
    eps = [episode("a", 0, [2, 3], 1.0), episode("b", 0, [4], 0.0), episode("c", 1, [1], 1.0), episode("d", 1, [5], 0.0)]
    adv = [np.full(len(ep.turns), a) for ep, a in zip(eps, [1.0, -1.0, 1.0, -1.0])]
    for reduction in ("token_mean", "sequence_mean"):
        items = build_items(eps, adv, prompts_per_minibatch=1, reduction=reduction)
        for m in (0, 1):
            total = sum(it.token_weight * it.n_scored for it in items if it.minibatch == m)
            assert abs(total - 1.0) < 1e-9, (reduction, m, total)
    seq = build_items(eps, adv, 2, "sequence_mean")
    # one mini-batch of 4 episodes: each episode's tokens share 1/4
    per_episode = {}
    for it in seq:
        per_episode[it.seq.episode_id] = per_episode.get(it.seq.episode_id, 0) + it.token_weight * it.n_scored
    assert all(abs(v - 0.25) < 1e-9 for v in per_episode.values())


def test_zero_advantage_groups_can_be_dropped_and_ranks_split_evenly():
    eps = [episode(str(i), i // 2, [2], float(i % 2)) for i in range(8)]
    adv = [np.array([a]) for a in [0.0, 0.0, 1, -1, 0.0, 0.0, 1, -1]]
    items = build_items(eps, adv, 4, "token_mean", drop_zero_advantage=True)
    assert {it.seq.episode_id for it in items} == {"2", "3", "6", "7"}
    shards = split_for_ranks(items, 3)
    assert sorted(len(s) for s in shards) == [1, 1, 2] and sum(len(s) for s in shards) == 4
    assert np.allclose(items[0].seq.rollout_logprobs(), [-0.1, -0.1])
    assert [it.key for it in items] == list(range(len(items)))  # ref and old log-probs are keyed by it


def test_sampled_token_mean_drops_zero_advantage_episodes_without_rescaling_the_rest():
    eps = [episode(str(i), i // 4, [2 + i], float(i % 2)) for i in range(8)]
    adv = [np.array([a]) for a in [0.0, 0.0, 1, -1, 0.0, 0.0, 0.0, 0.0]]  # group 1: no signal at all
    full = {it.seq.episode_id: it.token_weight for it in build_items(eps, adv, 1, "token_mean")}
    kept = build_items(eps, adv, 1, "sampled_token_mean", drop_zero_advantage=True)
    assert {it.seq.episode_id for it in kept} == {"2", "3"}
    # the same weights as training every sampled episode: group 0's 2+3+4+5 = 14 answer tokens
    assert all(it.token_weight == full[it.seq.episode_id] == 1 / 14 for it in kept)
    rescaled = build_items(eps, adv, 1, "token_mean", drop_zero_advantage=True)
    assert all(it.token_weight == 1 / (4 + 5) for it in rescaled)  # token_mean: the two kept episodes only


def test_micro_batches_hold_at_most_their_count_and_their_token_budget():
    from vlm.forward import cut_micro_batches
    lengths = [10, 10, 12, 30, 30, 31, 80, 200]  # ascending, as micro_batch_order leaves them
    by_count = cut_micro_batches(lengths, 3)
    assert [(c.start, c.stop) for c in by_count] == [(0, 3), (3, 6), (6, 8)]
    budget = cut_micro_batches(lengths, 3, max_tokens=64)
    assert [(c.start, c.stop) for c in budget] == [(0, 3), (3, 5), (5, 6), (6, 7), (7, 8)]
    for cut in budget:  # within both bounds, the longest alone only when it alone exceeds the budget
        n = cut.stop - cut.start
        assert n <= 3 and (n * max(lengths[cut]) <= 64 or n == 1)
    assert [lengths[i] for c in budget for i in range(c.start, c.stop)] == lengths  # every sequence once, in order
    assert cut_micro_batches([], 4, 64) == []


def test_a_random_action_trains_only_on_a_positive_advantage():
    """generator.explore_revisits: an explored turn keeps a positive advantage and loses a negative
    one; the sampled turns beside it keep theirs either way."""
    ep = episode("a", 0, [2, 3, 4, 1], 0.0)
    ep.turns[1].explored = ep.turns[2].explored = True
    items = build_items([ep], [np.array([-0.5, -2.0, 1.5, -1.0])], 1, "token_mean")
    np.testing.assert_array_equal(np.concatenate([it.advantage for it in items]),
                                  [-0.5] * 2 + [0.0] * 3 + [1.5] * 4 + [-1.0] * 1)
