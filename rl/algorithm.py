"""GRPO as the peers define it: group-relative advantages, the PPO-clip loss, KL to the reference.

Four small registries hold every choice the algorithm config names: advantage estimators (`grpo`,
with or without std normalisation, `rloo`, and GiGPO's step-level credit `gigpo`), policy losses
(`regular`: PPO-clip, as SkyRL calls it), KL estimators (k1, k2, k3) and loss reductions.
settings/schema.py lists the names a config may give; every one is registered here, and nothing
else (tests/test_algorithm.py checks both ways).

A turn's advantage is broadcast over the tokens of its answer only (the loss mask does that).
Losses are a per-token weighted sum: the weights encode the reduction (`token_mean`: every sampled
token of the mini-batch's trained episodes counts the same; `sequence_mean`: every episode counts
the same; `sampled_token_mean`: `token_mean` over every episode sampled for the mini-batch,
those `filter_zero_advantage_groups` drops included, so dropping them saves their compute and
leaves the policy gradient as it was, where `token_mean` scales the few episodes left up to a
full batch's weight), so micro-batching and data-parallel ranks give the exact same gradient as
one big batch.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from settings.schema import AlgorithmConfig

ADVANTAGE_ESTIMATORS: dict[str, Callable] = {}
POLICY_LOSSES: dict[str, Callable] = {}
KL_ESTIMATORS: dict[str, Callable] = {}
# How a mini-batch's loss averages its tokens (settings.schema.LOSS_REDUCTIONS); rl.batch turns the name
# into per-token weights.


def _register(table: dict, name: str):
    def wrap(fn):
        table[name] = fn
        return fn
    return wrap


def _lookup(table: dict, name: str, what: str):
    if name not in table:
        raise ValueError(f"unknown {what} '{name}'; known: {', '.join(table)}")
    return table[name]


# ---- advantages ---------------------------------------------------------------------------------
# An estimator takes the step's episodes (each with .group, .reward and .turns, a turn having the
# env .state it started from and its .reward) and returns one array per episode: an advantage for
# each of its turns, which every token of that turn's answer gets.
def group_relative(scores, keys, norm_by_std: bool, eps: float = 1e-6) -> np.ndarray:
    """(score - mean of its key's scores) / (their unbiased std + eps), or without the std.
    A key with one score, or all scores equal, gives exactly 0 (no NaN from a zero or tiny std)."""
    scores, keys = np.asarray(scores, dtype=np.float64), list(keys)
    index: dict = {}
    for i, k in enumerate(keys):
        index.setdefault(k, []).append(i)
    adv = np.zeros_like(scores)
    for idx in index.values():
        s = scores[idx]
        if len(s) < 2 or np.all(s == s[0]):
            continue
        centred = s - s.mean()
        adv[idx] = centred / (s.std(ddof=1) + eps) if norm_by_std else centred
    return adv


def _per_turn(episodes, episode_values) -> list[np.ndarray]:
    return [np.full(len(ep.turns), float(v)) for ep, v in zip(episodes, episode_values)]


@_register(ADVANTAGE_ESTIMATORS, "grpo")
def grpo_advantages(cfg: AlgorithmConfig, episodes) -> list[np.ndarray]:
    """GRPO: the episode's score against its group's (std-normalised unless grpo_norm_by_std=false,
    which is Dr. GRPO), the same for every turn."""
    adv = group_relative([ep.reward for ep in episodes], [ep.group for ep in episodes], cfg.grpo_norm_by_std)
    return _per_turn(episodes, adv)


@_register(ADVANTAGE_ESTIMATORS, "rloo")
def rloo_advantages(cfg: AlgorithmConfig, episodes) -> list[np.ndarray]:
    """Leave-one-out baseline: score minus the mean of the group's other samples."""
    scores = np.array([ep.reward for ep in episodes], dtype=np.float64)
    groups = np.array([ep.group for ep in episodes])
    adv = np.zeros_like(scores)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        if len(idx) > 1:
            adv[idx] = scores[idx] - (scores[idx].sum() - scores[idx]) / (len(idx) - 1)
    return _per_turn(episodes, adv)


def discounted_returns(rewards, gamma: float) -> np.ndarray:
    """R_t = r_t + gamma * R_{t+1}: each turn's return from there to the episode's end."""
    out, running = np.zeros(len(rewards)), 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def step_rewards(turns, stay_penalty: float, progress_reward: float = 0.0) -> list[float]:
    """Each turn's env reward, less `stay_penalty` where the next turn starts from the same state: a
    greedy agent that repeats a move into a wall sees the same input again and loops until its turns
    run out, and in a group where every episode fails the env's rewards alone say nothing about it.
    The last turn has no next state and is never penalised. Plus `progress_reward` times how much
    nearer the goal the turn's action took the env (a difference of potentials: no loop pays)."""
    return [t.reward + progress_reward * t.progress
            - (stay_penalty if k + 1 < len(turns) and turns[k + 1].state == t.state else 0.0)
            for k, t in enumerate(turns)]


@_register(ADVANTAGE_ESTIMATORS, "gigpo")
def gigpo_advantages(cfg: AlgorithmConfig, episodes) -> list[np.ndarray]:
    """GiGPO (Feng et al. 2025, arXiv 2505.10978): the episode-level group advantage of GRPO plus
    `gigpo.step_advantage_w` times a step-level one. Turns of one group's episodes that start from
    the same env state (Environment.state_key: for the maze, the agent's cell; a state visited twice
    in one episode included) form a step group; each turn's discounted return (`gigpo.gamma`) is
    compared with its step group's, normalised like the episode level (`grpo_norm_by_std`)."""
    episode_adv = group_relative([ep.reward for ep in episodes], [ep.group for ep in episodes], cfg.grpo_norm_by_std)
    g = cfg.gigpo
    returns = [discounted_returns(step_rewards(ep.turns, g.stay_penalty, g.progress_reward), g.gamma) for ep in episodes]
    keys = [(ep.group, t.state) for ep in episodes for t in ep.turns]
    step_adv = group_relative(np.concatenate(returns) if returns else [], keys, cfg.grpo_norm_by_std)
    out, i = [], 0
    for ep, a in zip(episodes, episode_adv):
        n = len(ep.turns)
        out.append(a + cfg.gigpo.step_advantage_w * step_adv[i:i + n])
        i += n
    return out


def compute_advantages(cfg: AlgorithmConfig, episodes) -> list[np.ndarray]:
    """One array per episode: the advantage of each of its turns."""
    return _lookup(ADVANTAGE_ESTIMATORS, cfg.advantage_estimator, "advantage estimator")(cfg, episodes)


# ---- per-token pieces ---------------------------------------------------------------------------
@_register(KL_ESTIMATORS, "k1")
def kl_k1(log_ratio: torch.Tensor) -> torch.Tensor:
    return log_ratio


@_register(KL_ESTIMATORS, "k2")
def kl_k2(log_ratio: torch.Tensor) -> torch.Tensor:
    return 0.5 * log_ratio ** 2


@_register(KL_ESTIMATORS, "k3")
def kl_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    # exp(ref - logp) - (ref - logp) - 1: unbiased and always >= 0; the clamp keeps exp finite
    r = (-log_ratio).clamp(-20, 20)
    return torch.exp(r) - r - 1


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens (Schulman's k1/k2/k3)."""
    return _lookup(KL_ESTIMATORS, kind, "KL estimator")(logp - ref_logp)


def ppo_clip_loss(logp, old_logp, advantages, eps_low: float = 0.2, eps_high: float = 0.2):
    """Per-token PPO-clip loss; also which tokens the clip bound and the log-ratio (for approx KL)."""
    log_ratio = (logp - old_logp).clamp(-20, 20)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_low, 1 + eps_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped, log_ratio


def entropy(logp_all: torch.Tensor) -> torch.Tensor:
    """Per-token entropy from the full log-softmax rows of the scored positions."""
    return -(logp_all.exp() * logp_all).sum(-1)


# ---- the policy loss ----------------------------------------------------------------------------
@_register(POLICY_LOSSES, "regular")
def ppo_policy_loss(cfg: AlgorithmConfig, logp, old_logp, advantages, weights, ref_logp=None,
                    token_entropy=None, rollout_logp=None) -> tuple[torch.Tensor, dict]:
    """PPO-clip + k-estimator KL to the reference (with use_kl_loss) - entropy bonus, as one
    weighted sum over the tokens given. `weights` are each token's share of its mini-batch's loss
    (0 for tokens that must not count); returns the loss and per-token sums for the diagnostics.

    With use_tis, `old_logp` is the trainer's own recomputation and `rollout_logp` the engines':
    the tokens were sampled from the engines' distribution, so each token's PPO term is weighted
    by min(pi_old / pi_engine, tis_imp_ratio_cap) (truncated importance sampling, no gradient)."""
    terms = ppo_clip_loss(logp, old_logp, advantages, cfg.eps_clip_low, cfg.eps_clip_high)
    return _with_kl_and_entropy(cfg, terms, logp, old_logp, weights, ref_logp, token_entropy, rollout_logp)


@_register(POLICY_LOSSES, "dual_clip")
def dual_clip_policy_loss(cfg: AlgorithmConfig, logp, old_logp, advantages, weights, ref_logp=None,
                          token_entropy=None, rollout_logp=None) -> tuple[torch.Tensor, dict]:
    """Dual-clip PPO (Ye et al. 2020; SkyRL's `dual_clip`): as `regular`, but a token with a negative
    advantage pays at most clip_ratio_c x |A|, so one token whose ratio has grown far past 1 cannot
    dominate the update."""
    pg, clipped, log_ratio = ppo_clip_loss(logp, old_logp, advantages, cfg.eps_clip_low, cfg.eps_clip_high)
    pg = torch.where(advantages < 0, torch.minimum(pg, -advantages * cfg.clip_ratio_c), pg)
    return _with_kl_and_entropy(cfg, (pg, clipped, log_ratio), logp, old_logp, weights, ref_logp, token_entropy,
                                rollout_logp)


def _with_kl_and_entropy(cfg: AlgorithmConfig, terms, logp, old_logp, weights, ref_logp, token_entropy,
                         rollout_logp) -> tuple[torch.Tensor, dict]:
    """A per-token policy-gradient loss summed by `weights` (TIS-weighted with use_tis), plus the KL
    and entropy terms, and the diagnostics."""
    pg, clipped, log_ratio = terms
    tis = torch.ones_like(pg)
    if cfg.use_tis:
        tis = torch.exp(old_logp - rollout_logp).clamp(max=cfg.tis_imp_ratio_cap).detach()
    pg_loss = (pg * tis * weights).sum()
    loss = pg_loss
    kl = torch.zeros((), device=logp.device)
    if ref_logp is not None:
        kl = (kl_penalty(logp, ref_logp, cfg.kl_estimator_type) * weights).sum()
        if cfg.use_kl_loss:
            loss = loss + cfg.kl_loss_coef * kl
    ent = torch.zeros((), device=logp.device)
    if token_entropy is not None:
        ent = (token_entropy * weights).sum()
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * ent
    active = (weights > 0).float()
    with torch.no_grad():
        stats = {"policy_loss": float(pg_loss), "policy_kl": float(kl), "entropy": float(ent),
                 "clipped": float((clipped.float() * active).sum()), "tokens": float(active.sum()),
                 "approx_kl": float(((torch.exp(log_ratio) - 1 - log_ratio) * active).sum()),
                 "tis_weight": float((tis * active).sum())}
    return loss, stats


def policy_loss(cfg: AlgorithmConfig, *args, **kwargs) -> tuple[torch.Tensor, dict]:
    """The registered loss that `cfg.policy_loss_type` names (the shards and the tests call this)."""
    return _lookup(POLICY_LOSSES, cfg.policy_loss_type, "policy loss")(cfg, *args, **kwargs)
