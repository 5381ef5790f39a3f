"""From episodes to what the shards train on: per-sequence advantages, loss weights, mini-batches.

Mini-batches count prompts (GRPO groups), as SkyRL's `policy_mini_batch_size` does. Each
sequence carries the weight of each of its scored tokens in its mini-batch's loss, computed once
here over the whole mini-batch, so any split across micro-batches and ranks sums to the same loss.
Items are split for the ranks once (`split_for_ranks`); every other per-token quantity (reference
and old log-probs) is keyed by `TrainItem.key`, so it can travel apart from the pictures.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rl.rollout import Episode
from settings.schema import LOSS_REDUCTIONS
from vlm.forward import TrainSeq


@dataclass
class TrainItem:
    key: int                    # the item's index in the step's batch
    seq: TrainSeq
    advantage: np.ndarray       # one value a scored token: the advantage of the turn it answers
    token_weight: float
    minibatch: int

    @property
    def n_scored(self) -> int:
        return self.seq.n_scored


def token_advantages(episode: Episode, seq: TrainSeq, turn_advantages) -> np.ndarray:
    """The advantage of each scored token of `seq`: its turn's, or for a random action
    (generator.explore_revisits) only a positive one: pushing down an action the policy would not
    have sampled spreads its probability over every other token, and the answers lose their format."""
    def of(k):
        return max(turn_advantages[k], 0.0) if episode.turns[k].explored else turn_advantages[k]
    return np.concatenate([np.full(len(episode.turns[k].response_ids), of(k), dtype=np.float32)
                           for k in seq.turns]) if seq.turns else np.zeros(0, np.float32)


def build_items(episodes: list[Episode], advantages: list[np.ndarray], prompts_per_minibatch: int, reduction: str,
                drop_zero_advantage: bool = False) -> list[TrainItem]:
    """advantages: per episode, one value a turn (rl.algorithm.compute_advantages)."""
    if reduction not in LOSS_REDUCTIONS:
        raise ValueError(f"unknown loss reduction '{reduction}'; known: {', '.join(LOSS_REDUCTIONS)}")
    groups = sorted({ep.group for ep in episodes})
    minibatch_of_group = {g: i // prompts_per_minibatch for i, g in enumerate(groups)}
    kept = [(ep, np.asarray(a)) for ep, a in zip(episodes, advantages) if not (drop_zero_advantage and not np.any(a))]
    # the episodes whose tokens share a mini-batch's weight (always every kept one): only
    # sampled_token_mean needs the dropped episodes' sequences, to count their tokens
    weighed = episodes if reduction == "sampled_token_mean" else [ep for ep, _ in kept]
    seqs_of = {ep.episode_id: ep.sequences() for ep in weighed}
    tokens_of_episode = {eid: sum(s.n_scored for s in seqs) for eid, seqs in seqs_of.items()}
    totals, episodes_in = {}, {}
    for ep in weighed:
        m = minibatch_of_group[ep.group]
        totals[m] = totals.get(m, 0) + tokens_of_episode[ep.episode_id]
    for ep, _ in kept:
        m = minibatch_of_group[ep.group]
        episodes_in[m] = episodes_in.get(m, 0) + 1
    items = []
    for ep, adv in kept:
        seqs = seqs_of[ep.episode_id]
        m = minibatch_of_group[ep.group]
        if reduction in ("token_mean", "sampled_token_mean"):
            w = 1.0 / max(totals[m], 1)
        else:  # sequence_mean
            w = 1.0 / max(tokens_of_episode[ep.episode_id], 1) / episodes_in[m]
        for s in seqs:
            items.append(TrainItem(len(items), s, token_advantages(ep, s, adv), w, m))
    return items


def split_for_ranks(items: list, world_size: int) -> list[list]:
    """Round-robin by sequence length so ranks get similar work; order within a rank is kept."""
    order = sorted(range(len(items)), key=lambda i: -len(items[i].seq.input_ids))
    shards = [[] for _ in range(world_size)]
    for k, i in enumerate(order):
        shards[k % world_size].append(i)
    return [[items[i] for i in sorted(s)] for s in shards]
