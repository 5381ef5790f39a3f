"""GRPO as the peers define it: group-relative advantages, the PPO-clip loss, KL to the reference.

Advantage estimators live in a small registry (`grpo`, with or without std normalisation, and
`rloo`). The episode's scalar advantage is broadcast over its generated tokens only (the loss
mask does that). Losses are written as a per-token weighted sum: the weights encode the
reduction (`token_mean`: every sampled token of the mini-batch counts the same; `sequence_mean`:
every episode counts the same), so micro-batching and data-parallel ranks give the exact same
gradient as one big batch.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

ADVANTAGE_ESTIMATORS: dict[str, Callable] = {}


def register_estimator(name: str):
    def wrap(fn):
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn
    return wrap


def _by_group(scores, groups):
    scores, groups = np.asarray(scores, dtype=np.float64), np.asarray(groups)
    return scores, groups, {g: np.flatnonzero(groups == g) for g in np.unique(groups)}


@register_estimator("grpo")
def grpo_advantages(scores, groups, norm_by_std: bool = True, eps: float = 1e-6) -> np.ndarray:
    """(score - group mean) / (group std + eps), std unbiased; Dr. GRPO's (score - mean) without std.

    A group whose scores are all equal gets exactly 0 (no NaN from a zero or tiny std).
    """
    scores, groups, index = _by_group(scores, groups)
    adv = np.zeros_like(scores)
    for idx in index.values():
        s = scores[idx]
        if len(s) < 2 or np.all(s == s[0]):
            continue
        centred = s - s.mean()
        adv[idx] = centred / (s.std(ddof=1) + eps) if norm_by_std else centred
    return adv


@register_estimator("rloo")
def rloo_advantages(scores, groups, **_) -> np.ndarray:
    """Leave-one-out baseline: score minus the mean of the group's other samples."""
    scores, groups, index = _by_group(scores, groups)
    adv = np.zeros_like(scores)
    for idx in index.values():
        s = scores[idx]
        if len(s) < 2:
            continue
        adv[idx] = s - (s.sum() - s) / (len(s) - 1)
    return adv


def compute_advantages(estimator: str, scores, groups, **kwargs) -> np.ndarray:
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown advantage estimator '{estimator}'; known: {', '.join(ADVANTAGE_ESTIMATORS)}")
    return ADVANTAGE_ESTIMATORS[estimator](scores, groups, **kwargs)


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens (Schulman's k1/k2/k3)."""
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio ** 2
    if kind == "k3":
        # exp(ref - logp) - (ref - logp) - 1: unbiased and always >= 0; clamp keeps exp finite
        r = (-log_ratio).clamp(-20, 20)
        return torch.exp(r) - r - 1
    raise ValueError(f"unknown KL estimator '{kind}'; use k1, k2 or k3")


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
