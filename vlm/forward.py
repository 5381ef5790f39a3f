"""Batched forward passes over training sequences: per-token log-probs of the sampled tokens.

Sequences are right-padded into one batch with their pictures; only the masked-in (sampled)
positions are scored, so the vocabulary-wide log-softmax runs on those rows alone (a real
Qwen3-VL has 152k tokens). Every per-token quantity in the trainer is a flat vector in this
order: sequence by sequence, masked-in positions left to right.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from inference.pictures import PicturePreprocessor


@dataclass
class TrainSeq:
    """One sequence the trainer scores: token ids, a loss mask that is 1 exactly on sampled tokens,
    the sampling log-prob at each masked-in position (0 elsewhere), and the pictures its ids hold."""
    episode_id: str
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    images: list[np.ndarray]
    turns: list[int] = field(default_factory=list)  # the episode turns whose answers it holds, in order

    @property
    def n_scored(self) -> int:
        return int(sum(self.loss_mask[1:]))  # position t predicts token t+1: the first is never scored

    def rollout_logprobs(self) -> np.ndarray:
        """The sampling log-probs of the scored tokens, in the trainer's flat order."""
        return np.array([lp for lp, m in zip(self.logprobs[1:], self.loss_mask[1:]) if m], dtype=np.float32)


def collate(seqs, processor, device: str, dtype=torch.float32, pictures=None) -> dict:
    """One padded batch of `seqs` on `device`; `pictures` (an inference.pictures.PicturePreprocessor)
    reuses the image processor's output for pictures it has seen, else every picture is processed."""
    tok = processor.tokenizer
    image_token_id = tok.convert_tokens_to_ids("<|image_pad|>")
    width = max(len(s.input_ids) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(seqs):
        n = len(s.input_ids)
        ids[row, :n] = torch.tensor(s.input_ids)
        attn[row, :n] = 1
        mask[row, :n] = torch.tensor(s.loss_mask)
    batch = {"input_ids": ids.to(device), "attention_mask": attn.to(device),
             "mm_token_type_ids": (ids == image_token_id).long().to(device), "loss_mask": mask.to(device)}
    images = [img for s in seqs for img in s.images]
    if images:
        enc = pictures(images, device) if pictures else processor.image_processor(images=images, return_tensors="pt")
        batch["pixel_values"] = enc["pixel_values"].to(device, dtype)
        batch["image_grid_thw"] = enc["image_grid_thw"].to(device)
    return batch


def sampled_logprobs(model, batch: dict, temperature: float = 1.0, with_distribution: bool = False):
    """Log-probs (flat, masked-in positions) of the tokens in the batch under `model`; with
    `with_distribution`, also the full log-softmax rows of those positions (for the entropy)."""
    inputs = {k: v for k, v in batch.items() if k != "loss_mask"}
    # position t predicts token t+1: token t is scored with the logits of position t-1
    target_mask = batch["loss_mask"][:, 1:].bool()
    # the vocabulary projection only where some row scores a token (the answers): at 8B the full
    # logits of a micro-batch are GBs, and most positions are prompt
    keep = target_mask.any(0).nonzero().squeeze(-1)
    logits = model(**inputs, use_cache=False, logits_to_keep=keep).logits
    rows = logits[target_mask[:, keep]].float() / temperature
    targets = batch["input_ids"][:, 1:][target_mask]
    logp_all = torch.log_softmax(rows, -1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    return logp, (logp_all if with_distribution else None)


def agree_max(n: int, world_size: int, device: str) -> int:
    """The largest n over the process group: FSDP ranks must run the same number of passes."""
    if world_size == 1:
        return n
    import torch.distributed as dist
    t = torch.tensor([n], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def micro_batch_order(seqs: list[TrainSeq]) -> list[int]:
    """The indices of `seqs` in the order they are cut into micro-batches: alike lengths together
    (less padding) and, among equal lengths, the copies of a picture side by side. The vision tower
    encodes each distinct picture of a micro-batch once (vlm/unique_pictures.py) and a GRPO group's
    episodes keep showing each other's pictures: ordered by length alone, a step of the CPU default
    encoded 657 pictures in its train pass where 426 differ."""
    pictures = [tuple(PicturePreprocessor.key(p) for p in s.images) for s in seqs]
    return sorted(range(len(seqs)), key=lambda i: (len(seqs[i].input_ids), pictures[i]))


def cut_micro_batches(lengths: list[int], size: int, max_tokens: int = 0) -> list[slice]:
    """Consecutive micro-batches over sequences of these lengths (in micro_batch_order): at most `size`
    sequences each and, with `max_tokens`, at most that many padded tokens (its count times its longest
    sequence), so a pass's memory is bounded whatever the lengths. A sequence longer than `max_tokens`
    is a micro-batch alone."""
    cuts, start, longest = [], 0, 0
    for i, n in enumerate(lengths):
        count = i - start
        if count and (count == size or (max_tokens and (count + 1) * max(longest, n) > max_tokens)):
            cuts.append(slice(start, i))
            start, longest = i, 0
        longest = max(longest, n)
    if lengths:
        cuts.append(slice(start, len(lengths)))
    return cuts


@torch.no_grad()
def score_seqs(model, processor, seqs: list[TrainSeq], micro_batch: int, device: str, dtype, temperature: float,
               world_size: int = 1, pictures=None, max_tokens: int = 0) -> list[np.ndarray]:
    """Per-sequence arrays of sampled-token log-probs, micro-batched (`cut_micro_batches`), in step with
    the other ranks. Micro-batches hold sequences of alike length and shared pictures; the result keeps
    the input order."""
    order = micro_batch_order(seqs)
    cuts = cut_micro_batches([len(seqs[i].input_ids) for i in order], micro_batch, max_tokens)
    chunks = [[seqs[i] for i in order[cut]] for cut in cuts]
    scored = []
    for k in range(agree_max(len(chunks), world_size, device)):
        chunk = chunks[k] if k < len(chunks) else chunks[0]  # a pass whose result is dropped
        logp, _ = sampled_logprobs(model, collate(chunk, processor, device, dtype, pictures), temperature)
        if k < len(chunks):
            scored += np.split(logp.float().cpu().numpy(), np.cumsum([s.n_scored for s in chunk])[:-1])
    out = [None] * len(seqs)
    for i, lp in zip(order, scored):
        out[i] = lp
    return out
