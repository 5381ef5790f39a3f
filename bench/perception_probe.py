"""How well a model's vision tower alone tells the way to the goal, cell by cell.

    python bench/perception_probe.py assets/maze-vl-base [--adapter DIR] [--sizes 9 11] [--blocks]

A fresh linear probe learns, from the frozen tower's picture tokens, the BFS expert's move from
every floor cell (stage A's task in sft/embedded_base.py, the disc anywhere), then is scored on
256 other pictures a size: overall, by the cell's distance to the goal, and at junctions (three
or more open neighbours), where a wrong answer is a wrong branch. A linear probe on frozen
features reads what the tower already encodes; it scores below the probe trained with the
tower in stage A.

With `--blocks`, the same for the sliding-block picture: a probe learns which block (or none)
covers each cell of both boards, from boards shuffled by 1 to 12 moves, and is scored on the
yellow 1x1 blocks (7 to 10, told apart only by the digit drawn on them) and on 9 against 10.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from tqdm import tqdm

from envs.actions import ACTIONS
from envs.expert import goal_fields, junctions
from envs.maze import MazeEnv
from sft.embedded_base import block_pictures, maze_pictures
from vlm.load import load_model

TRAIN_SEEDS = 40_000_000   # far from every set the project trains or evaluates on
TEST_SEEDS = 41_000_000
DISTANCES = ((1, 8), (8, 16), (16, 24), (24, 32), (32, 200))


def tower_features(vision, processor, size: int, first_seed: int, n: int, rng) -> tuple[torch.Tensor, np.ndarray,
                                                                                      np.ndarray, np.ndarray]:
    """Picture tokens of n mazes of one size; each cell's expert move, distance to the goal, and junction flag."""
    images, mazes = maze_pictures({size: MazeEnv(size=size, cell_px=16)}, (size,), first_seed, n, rng)
    enc = processor.image_processor(images=images, return_tensors="pt")
    with torch.no_grad():
        features = vision(enc["pixel_values"], grid_thw=enc["image_grid_thw"]).pooler_output
    moves, distances, branching = [], [], []
    for env in mazes:
        move, distance = goal_fields(env.maze, env.target)
        moves.append(move.reshape(-1))
        distances.append(distance.reshape(-1))
        branching.append(junctions(env.maze).reshape(-1))
    return features, np.concatenate(moves), np.concatenate(distances), np.concatenate(branching)


def train_probe(batch, classes: int, width: int, steps: int, seed: int, desc: str) -> torch.nn.Linear:
    """A linear probe fitted to `batch(first seed)` -> (features, labels; -1 ignored), 32 pictures a step."""
    torch.manual_seed(seed)
    probe = torch.nn.Linear(width, classes)
    opt = torch.optim.AdamW(probe.parameters(), lr=3e-3)
    for step in tqdm(range(steps), desc=desc, unit="step"):
        features, labels = batch(TRAIN_SEEDS + step * 32)
        loss = torch.nn.functional.cross_entropy(probe(features), torch.tensor(labels), ignore_index=-1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return probe


def probe_size(vision, processor, size: int, steps: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    probe = train_probe(lambda first: tower_features(vision, processor, size, first, 32, rng)[:2], len(ACTIONS),
                        vision.config.out_hidden_size, steps, seed, f"probe {size}x{size}")
    features, moves, distances, branching = tower_features(vision, processor, size, TEST_SEEDS, 256, rng)
    with torch.no_grad():
        right = (probe(features).argmax(-1).numpy() == moves)
    floor = moves >= 0
    report = {"size": size, "cells": int(floor.sum()), "accuracy": round(float(right[floor].mean()), 3), "by_distance": []}
    for lo, hi in DISTANCES:
        at = floor & (distances >= lo) & (distances < hi)
        if at.any():
            report["by_distance"].append({"distance": f"{lo}-{hi - 1}", "cells": int(at.sum()),
                                          "accuracy": round(float(right[at].mean()), 3),
                                          "junctions": int((at & branching).sum()),
                                          "junction_accuracy": round(float(right[at & branching].mean()), 3)
                                          if (at & branching).any() else None})
    return report


def block_features(vision, processor, first_seed: int, n: int, cell_px: int) -> tuple[torch.Tensor, np.ndarray]:
    """Picture tokens of n sliding-block pictures (one token a cell, both boards) and each cell's
    block id (0 empty, -1 the gap between the boards)."""
    images, labels = block_pictures(first_seed, n, cell_px)
    enc = processor.image_processor(images=images, return_tensors="pt")
    with torch.no_grad():
        features = vision(enc["pixel_values"], grid_thw=enc["image_grid_thw"]).pooler_output
    return features, np.concatenate(labels)


def probe_blocks(vision, processor, steps: int, seed: int, cell_px: int = 16) -> dict:
    probe = train_probe(lambda first: block_features(vision, processor, first, 32, cell_px), 11,
                        vision.config.out_hidden_size, steps, seed, "probe block ids")
    features, ids = block_features(vision, processor, TEST_SEEDS, 256, cell_px)
    with torch.no_grad():
        guess = probe(features).argmax(-1).numpy()
    board, yellow, twins = ids >= 0, ids >= 7, (ids == 9) | (ids == 10)
    return {"cells": int(board.sum()), "accuracy": round(float((guess == ids)[board].mean()), 3),
            "yellow_cells": int(yellow.sum()), "yellow_accuracy": round(float((guess == ids)[yellow].mean()), 3),
            "nine_or_ten_cells": int(twins.sum()), "nine_or_ten_accuracy": round(float((guess == ids)[twins].mean()), 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a model folder (the embedded base or another of its shape)")
    ap.add_argument("--adapter", help="a LoRA adapter folder, merged into the model first")
    ap.add_argument("--sizes", type=int, nargs="+", default=[9, 11])
    ap.add_argument("--blocks", action="store_true", help="probe the sliding-block picture's block ids instead")
    ap.add_argument("--steps", type=int, default=300, help="probe training steps of 32 pictures")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, processor = load_model(args.model)
    if args.adapter:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, args.adapter).merge_and_unload()
    vision = model.model.visual.eval().requires_grad_(False)
    if args.blocks:
        print(json.dumps({"model": args.model, "adapter": args.adapter, **probe_blocks(vision, processor, args.steps,
                                                                                      args.seed)}), flush=True)
        return
    for size in args.sizes:
        report = probe_size(vision, processor, size, args.steps, args.seed)
        print(json.dumps({"model": args.model, "adapter": args.adapter, **report}), flush=True)


if __name__ == "__main__":
    main()
