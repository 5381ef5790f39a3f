"""The algorithm module against hand-computed values."""
import math

import numpy as np
import pytest
import torch

from rl.algorithm import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    compute_advantages,
    entropy,
    kl_penalty,
    policy_loss,
    ppo_clip_loss,
)
from rl.rollout import Episode, Turn
from settings.schema import AlgorithmConfig

GRPO, DR_GRPO, RLOO = AlgorithmConfig(), AlgorithmConfig(grpo_norm_by_std=False), AlgorithmConfig(advantage_estimator="rloo")


def episodes_of(scores, groups):
    """Episodes of one turn each, scored `scores`, in `groups`."""
    out = []
    for i, (score, group) in enumerate(zip(scores, groups)):
        ep = Episode(f"e{i}", group, None, reward=float(score))
        ep.turns.append(Turn([1], [2], [0.0], [0], "x", state=(1, 1), reward=float(score)))
        out.append(ep)
    return out


def adv(cfg, scores, groups):
    return np.concatenate(compute_advantages(cfg, episodes_of(scores, groups)))


def test_grpo_hand_computed():
    # group 0: scores 1, 0, 0, 1 -> mean 0.5, unbiased std = sqrt(1/3)
    a = adv(GRPO, [1, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 1])
    s = math.sqrt(1 / 3)
    np.testing.assert_allclose(a[:4], [0.5 / (s + 1e-6), -0.5 / (s + 1e-6), -0.5 / (s + 1e-6), 0.5 / (s + 1e-6)])
    assert list(a[4:]) == [0.0, 0.0]  # all-equal group: exactly zero, no NaN


def test_dr_grpo_and_rloo_hand_computed():
    np.testing.assert_allclose(adv(DR_GRPO, [1, 0, 0, 0], [0] * 4), [0.75, -0.25, -0.25, -0.25])
    # RLOO: 1 - mean(0,0,0) = 1; 0 - mean(1,0,0) = -1/3
    np.testing.assert_allclose(adv(RLOO, [1, 0, 0, 0], [0] * 4), [1, -1 / 3, -1 / 3, -1 / 3])


def test_tiny_std_does_not_blow_up():
    a = adv(GRPO, [1.0, 1.0 + 1e-12, 1.0], [0, 0, 0])
    assert np.all(np.isfinite(a)) and np.abs(a).max() < 1e-3
    with pytest.raises(ValueError, match="known: grpo"):
        adv(AlgorithmConfig(advantage_estimator="gae"), [1], [0])


def walk(eid, group, cells, reward):
    """An episode through `cells` (the state each turn starts from); the last turn earns `reward`."""
    ep = Episode(eid, group, None, reward=reward)
    for k, cell in enumerate(cells):
        ep.images.append(np.zeros((2, 2, 3), np.uint8))
        ep.turns.append(Turn([1], [2, 3], [0.0, 0.0], [k], "x", state=cell, reward=reward if k == len(cells) - 1 else 0.0))
    return ep


def test_gigpo_hand_computed_with_a_state_visited_twice():
    """Two episodes of one maze. A: a -> b -> a -> goal, solved in 4 turns (it visits a twice).
    B: a -> c, fails in 2 turns. gamma 0.5, weight 1, Dr. GRPO normalisation (no std) so the
    values are easy to check by hand."""
    A = walk("A", 0, [(1, 1), (1, 2), (1, 1), (1, 3)], 1.0)
    B = walk("B", 0, [(1, 1), (2, 1)], 0.0)
    cfg = AlgorithmConfig(advantage_estimator="gigpo", grpo_norm_by_std=False)
    cfg.gigpo.gamma, cfg.gigpo.step_advantage_w = 0.5, 1.0
    a, b = compute_advantages(cfg, [A, B])
    # episode level: scores 1, 0 -> +0.5, -0.5
    # returns: A 0.125, 0.25, 0.5, 1 (turns 0..3); B 0, 0
    # step group (1,1): A turn 0 (0.125), A turn 2 (0.5), B turn 0 (0): mean 0.625/3
    m = 0.625 / 3
    np.testing.assert_allclose(a, [0.5 + 0.125 - m, 0.5 + 0, 0.5 + 0.5 - m, 0.5 + 0])  # (1,2), (1,3) alone: 0
    np.testing.assert_allclose(b, [-0.5 + 0 - m, -0.5 + 0])
    std = AlgorithmConfig(advantage_estimator="gigpo")  # the defaults: std-normalised, gamma 0.95, weight 1
    returns = np.array([0.95 ** 3, 0.95, 0.0])
    z = (returns - returns.mean()) / (returns.std(ddof=1) + 1e-6)
    ep_a = 0.5 / (np.std([1, 0], ddof=1) + 1e-6)
    a, b = compute_advantages(std, [A, B])
    np.testing.assert_allclose([a[0], a[2], b[0]], [ep_a + z[0], ep_a + z[1], -ep_a + z[2]])


def test_gigpo_prefers_the_shorter_of_two_successes():
    """Both episodes solve the maze (GRPO sees no signal); GiGPO's step level favours the shortcut."""
    short = walk("s", 0, [(1, 1), (1, 3)], 1.0)
    long = walk("l", 0, [(1, 1), (2, 1), (1, 1), (1, 3)], 1.0)
    assert not np.any(np.concatenate(compute_advantages(GRPO, [short, long])))
    s, l_ = compute_advantages(AlgorithmConfig(advantage_estimator="gigpo"), [short, long])
    assert s[0] > 0 and l_[0] < 0 and l_[2] > l_[0]  # from (1,1): the turn that goes straight on wins


def test_gigpo_stay_penalty_gives_a_group_of_failures_a_signal_against_the_repeated_wall_hit():
    """Both episodes fail: without the penalty every advantage is zero. With it, B's two turns that
    stay on (1, 1) (wall hits) lose against A's move away from it; the episode level stays zero."""
    A = walk("A", 0, [(1, 1), (1, 2), (1, 3)], 0.0)
    B = walk("B", 0, [(1, 1), (1, 1), (1, 1)], 0.0)
    cfg = AlgorithmConfig(advantage_estimator="gigpo", grpo_norm_by_std=False)
    cfg.gigpo.gamma = 0.5
    assert not np.any(np.concatenate(compute_advantages(cfg, [A, B])))
    cfg.gigpo.stay_penalty = 0.1
    a, b = compute_advantages(cfg, [A, B])
    # returns: A 0, 0, 0; B -0.1 - 0.05, -0.1, 0 (its last turn has no next state)
    # step group (1,1): A turn 0 and B's three: mean -0.25 / 4
    m = -0.25 / 4
    np.testing.assert_allclose(a, [0 - m, 0, 0])
    np.testing.assert_allclose(b, [-0.15 - m, -0.1 - m, 0 - m])
    assert a[0] > 0 > b[0]


def test_gigpo_progress_reward_tells_a_group_of_failures_which_first_move_went_towards_the_goal():
    """Both episodes fail from the same start: without the progress reward every advantage is zero.
    With it, A's first move (a block onto its target cell, +0.1) beats B's (one off it, -0.1), and a
    move that is undone pays nothing in sum; the episode level stays zero."""
    A = walk("A", 0, [(1, 1), (1, 2), (1, 3)], 0.0)
    B = walk("B", 0, [(1, 1), (2, 1), (1, 1)], 0.0)
    for turn, gain in zip(A.turns + B.turns, [0.1, 0.0, 0.0, -0.1, 0.1, 0.0]):
        turn.progress = gain
    cfg = AlgorithmConfig(advantage_estimator="gigpo", grpo_norm_by_std=False)
    cfg.gigpo.gamma = 0.5
    assert not np.any(np.concatenate(compute_advantages(cfg, [A, B])))
    cfg.gigpo.progress_reward = 2.0
    a, b = compute_advantages(cfg, [A, B])
    # returns: A 0.2, 0, 0; B -0.2 + 0.5 * 0.2 = -0.1, 0.2, 0. Step group (1,1): A's turn 0, B's turns 0
    # and 2, mean (0.2 - 0.1 + 0) / 3; the others are alone in theirs (advantage 0)
    m = 0.1 / 3
    np.testing.assert_allclose(a, [0.2 - m, 0, 0], atol=1e-12)
    np.testing.assert_allclose(b, [-0.1 - m, 0, 0 - m], atol=1e-12)
    assert a[0] > 0 > b[0]


def test_per_turn_advantages_reach_exactly_their_turns_tokens():
    from rl.batch import build_items
    A = walk("A", 0, [(1, 1), (1, 2), (1, 1), (1, 3)], 1.0)
    B = walk("B", 0, [(1, 1), (2, 1)], 0.0)
    cfg = AlgorithmConfig(advantage_estimator="gigpo", grpo_norm_by_std=False)
    per_turn = compute_advantages(cfg, [A, B])
    items = build_items([A, B], per_turn, 1, "token_mean")
    by_episode = {}
    for it in items:
        by_episode.setdefault(it.seq.episode_id, []).append(it.advantage)
    np.testing.assert_allclose(np.concatenate(by_episode["A"]), np.repeat(per_turn[0], 2))  # 2 tokens a turn
    np.testing.assert_allclose(np.concatenate(by_episode["B"]), np.repeat(per_turn[1], 2))


def test_kl_estimators_hand_computed():
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    d = logp - ref  # 0.5, -1.0
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), d)
    torch.testing.assert_close(kl_penalty(logp, ref, "k2"), 0.5 * d ** 2)
    torch.testing.assert_close(kl_penalty(logp, ref, "k3"), torch.exp(-d) + d - 1)
    assert (kl_penalty(torch.randn(100), torch.randn(100), "k3") >= 0).all()


def test_ppo_clip_hand_computed():
    old = torch.zeros(3)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1]))  # ratios 1.5, 0.5, 1.1
    adv = torch.tensor([1.0, -1.0, 2.0])
    loss, clipped, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.2)
    # A>0, r=1.5: max(-1.5, -1.2) = -1.2 (clipped); A<0, r=0.5: max(0.5, 0.8) = 0.8 (clipped); r=1.1: -2.2
    torch.testing.assert_close(loss, torch.tensor([-1.2, 0.8, -2.2]))
    assert clipped.tolist() == [True, True, False]
    _, clipped_high, _ = ppo_clip_loss(logp, old, adv, 0.2, 0.6)  # a wider upper clip lets 1.5 through
    assert clipped_high.tolist() == [False, True, False]


def test_entropy_hand_computed():
    uniform = torch.log(torch.full((1, 4), 0.25))
    torch.testing.assert_close(entropy(uniform), torch.tensor([math.log(4)]))


def test_dual_clip_caps_negative_advantages_only():
    """dual_clip: a token with a negative advantage whose ratio has run far past 1 + eps pays at most
    clip_ratio_c x |A|; positive advantages lose exactly what `regular` gives."""
    logp = torch.log(torch.tensor([5.0, 5.0, 0.5, 1.1]))  # ratios 5, 5, 0.5, 1.1 against old 1
    old, adv = torch.zeros(4), torch.tensor([-1.0, 1.0, -2.0, 2.0])
    weights = torch.full((4,), 0.25)
    regular, _ = policy_loss(AlgorithmConfig(use_kl_loss=False), logp, old, adv, weights)
    dual, _ = policy_loss(AlgorithmConfig(use_kl_loss=False, policy_loss_type="dual_clip", clip_ratio_c=3.0),
                          logp, old, adv, weights)
    # per token, regular: max(-A r, -A clip(r)) = 5, -1.2, 1.6, -2.2; dual_clip caps the first at 3
    assert abs(float(regular) - 0.25 * (5 - 1.2 + 1.6 - 2.2)) < 1e-6
    assert abs(float(dual) - 0.25 * (3 - 1.2 + 1.6 - 2.2)) < 1e-6
    from settings import ConfigError, load_config
    with pytest.raises(ConfigError, match="clip_ratio_c.? must be > 1"):
        load_config(None, ["trainer.algorithm.policy_loss_type=dual_clip", "trainer.algorithm.clip_ratio_c=0.5"])


def test_policy_loss_hand_computed():
    """The registered loss the shards call: clipped surrogate + k3 KL - entropy bonus, weighted."""
    cfg = AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.5, entropy_coef=0.1)
    logp = torch.log(torch.tensor([1.5, 0.5, 1.1]))
    old, adv = torch.zeros(3), torch.tensor([1.0, -1.0, 2.0])
    weights = torch.tensor([0.5, 0.25, 0.25])
    ref = torch.log(torch.tensor([1.0, 1.0, 1.0]))
    ent = torch.tensor([0.2, 0.4, 0.6])
    loss, stats = policy_loss(cfg, logp, old, adv, weights, ref_logp=ref, token_entropy=ent)
    pg = 0.5 * -1.2 + 0.25 * 0.8 + 0.25 * -2.2  # the clipped surrogate of test_ppo_clip_hand_computed
    d = logp - ref
    kl = float(((torch.exp(-d) + d - 1) * weights).sum())
    entropy_term = 0.5 * 0.2 + 0.25 * 0.4 + 0.25 * 0.6
    assert abs(float(loss) - (pg + 0.5 * kl - 0.1 * entropy_term)) < 1e-6
    assert abs(stats["policy_loss"] - pg) < 1e-6 and abs(stats["policy_kl"] - kl) < 1e-6
    assert stats["clipped"] == 2 and stats["tokens"] == 3
    no_kl, _ = policy_loss(AlgorithmConfig(use_kl_loss=False), logp, old, adv, weights, ref_logp=ref)
    assert abs(float(no_kl) - pg) < 1e-6  # the KL is measured but not in the loss
    zero = policy_loss(cfg, logp, old, adv, torch.zeros(3), ref_logp=ref, token_entropy=ent)[0]
    assert float(zero) == 0.0  # tokens of weight 0 (a padding pass) contribute nothing


def test_truncated_importance_sampling_hand_computed():
    """use_tis: each token's PPO term weighted by min(pi_old / pi_engine, cap), with no gradient."""
    old = torch.tensor([-1.0, -1.0, -2.0])
    engine = torch.tensor([-1.5, -0.2, -2.0])  # the engine found token 0 less likely, token 1 more
    adv, weights = torch.tensor([1.0, 1.0, -1.0]), torch.tensor([0.5, 0.25, 0.25])
    for cap, w0 in ((2.0, math.exp(0.5)), (1.5, 1.5)):
        cfg = AlgorithmConfig(use_kl_loss=False, use_tis=True, tis_imp_ratio_cap=cap)
        logp = old.clone().requires_grad_(True)  # ratio 1: the surrogate is -A
        loss, stats = policy_loss(cfg, logp, old, adv, weights, rollout_logp=engine)
        tis = torch.tensor([w0, math.exp(-0.8), 1.0])
        assert abs(float(loss) - float((-adv * tis * weights).sum())) < 1e-6
        loss.backward()
        torch.testing.assert_close(logp.grad, -adv * tis * weights)  # d(-A r)/d logp = -A r, r = 1
        assert abs(stats["tis_weight"] - float(tis.sum())) < 1e-5
    plain, _ = policy_loss(AlgorithmConfig(use_kl_loss=False), old, old, adv, weights, rollout_logp=engine)
    assert abs(float(plain) - float((-adv * weights).sum())) < 1e-6  # without use_tis the engine is not consulted


def test_registries_are_the_valid_config_names():
    """settings.schema lists the names a config may give; each is registered, and nothing else."""
    from settings import ConfigError, load_config, schema
    assert schema.ADVANTAGE_ESTIMATORS == tuple(ADVANTAGE_ESTIMATORS)
    assert schema.POLICY_LOSSES == tuple(POLICY_LOSSES)
    assert schema.KL_ESTIMATORS == tuple(KL_ESTIMATORS)
    for name in ADVANTAGE_ESTIMATORS:
        assert load_config(None, [f"trainer.algorithm.advantage_estimator={name}"])
    with pytest.raises(ConfigError, match="grpo, rloo"):
        load_config(None, ["trainer.algorithm.policy_loss_type=regular", "trainer.algorithm.advantage_estimator=gae"])
