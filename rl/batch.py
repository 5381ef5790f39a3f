"""From episodes to what the shards train on: per-sequence advantages, loss weights, mini-batches.

Mini-batches count prompts (GRPO groups), as SkyRL's `policy_mini_batch_size` does. Each
sequence carries the weight of each of its scored tokens in its mini-batch's loss, computed once
here over the whole mini-batch, so any split across micro-batches and ranks sums to the same loss.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rl.rollout import Episode, TrainSeq


@dataclass
class TrainItem:
    seq: TrainSeq
    advantage: float
    token_weight: float
    minibatch: int
    old_logprobs: np.ndarray | None = None
    ref_logprobs: np.ndarray | None = None

    @property
    def n_scored(self) -> int:
        return int(sum(self.seq.loss_mask[1:]))


def rollout_logprobs(seq: TrainSeq) -> np.ndarray:
    """The sampling log-probs of the scored tokens, in the trainer's flat order."""
    return np.array([lp for lp, m in zip(seq.logprobs[1:], seq.loss_mask[1:]) if m], dtype=np.float32)


def build_items(episodes: list[Episode], advantages, prompts_per_minibatch: int, reduction: str,
                drop_zero_advantage: bool = False) -> list[TrainItem]:
    groups = sorted({ep.group for ep in episodes})
    minibatch_of_group = {g: i // prompts_per_minibatch for i, g in enumerate(groups)}
    kept = [(ep, float(a)) for ep, a in zip(episodes, advantages)
            if not (drop_zero_advantage and a == 0.0)]
    per_episode = [(ep, a, ep.sequences()) for ep, a in kept]
    tokens_of_episode = {ep.episode_id: sum(int(sum(s.loss_mask[1:])) for s in seqs) for ep, _, seqs in per_episode}
    totals, episodes_in = {}, {}
    for ep, _, _ in per_episode:
        m = minibatch_of_group[ep.group]
        totals[m] = totals.get(m, 0) + tokens_of_episode[ep.episode_id]
        episodes_in[m] = episodes_in.get(m, 0) + 1
    items = []
    for ep, adv, seqs in per_episode:
        m = minibatch_of_group[ep.group]
        if reduction == "token_mean":
            w = 1.0 / max(totals[m], 1)
        elif reduction == "sequence_mean":
            w = 1.0 / max(tokens_of_episode[ep.episode_id], 1) / episodes_in[m]
        else:
            raise ValueError(f"unknown loss reduction '{reduction}'")
        for s in seqs:
            items.append(TrainItem(s, adv, w, m, old_logprobs=rollout_logprobs(s)))
    return items


def split_for_ranks(items: list, world_size: int) -> list[list]:
    """Round-robin by sequence length so ranks get similar work; order within a rank is kept."""
    order = sorted(range(len(items)), key=lambda i: -len(items[i].seq.input_ids))
    shards = [[] for _ in range(world_size)]
    for k, i in enumerate(order):
        shards[k % world_size].append(i)
    return [[items[i] for i in sorted(s)] for s in shards]
