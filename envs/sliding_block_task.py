"""VisGym's sliding-block puzzle (envs/sliding_block.py) behind the environment interface:
`sliding_block/easy` (the target is the solved layout shuffled by 3 moves) and `sliding_block/hard`
(by 8). A row is a seed, its target layout and the fewest moves that reach it (the BFS expert)."""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from envs.base import Environment
from envs.rows import seed_splits, write_splits
from envs.sliding_block import COLS, DIRECTIONS, ROWS, SOLVED, SlidingBlockEnv, legal_moves, shortest_moves, shuffled_target

SHUFFLES = {"sliding_block/easy": 3, "sliding_block/hard": 8}

INSTRUCTION = ("Two boards: the target on the left, yours on the right. Slide one block a turn into empty cells "
               "until yours matches the target: <action>BLOCK DIRECTION</action>, e.g. <action>7 up</action>. "
               "When they match: <action>stop</action>.")


def move_text(block: int, direction: int) -> str:
    return f"<action>{block} {DIRECTIONS[direction]}</action>"


def make_rows(env_id: str, seed_start: int, count: int, max_turns: int, solvable_only: bool,
              seed_limit: int | None = None) -> tuple[list[dict], int]:
    """(rows, seeds scanned), seeds upwards from seed_start; with solvable_only a seed is kept only
    when the expert's moves plus the stop fit max_turns."""
    rows, seed = [], seed_start
    while len(rows) < count:
        if seed_limit is not None and seed >= seed_limit:
            raise ValueError(f"seed range [{seed_start}, {seed_limit}) holds only {len(rows)} usable puzzles, "
                             f"{count} asked for")
        target = shuffled_target(np.random.default_rng(seed), SHUFFLES[env_id])
        moves = len(shortest_moves(dict(SOLVED), target))
        if not solvable_only or moves + 1 <= max_turns:
            rows.append({"seed": seed, "env_id": env_id, "target": {str(b): list(p) for b, p in target.items()},
                         "optimal_moves": moves})
        seed += 1
    return rows, seed - seed_start


class SlidingBlockTask(Environment):
    instruction = INSTRUCTION

    def __init__(self, name: str):
        self.name, self.shuffle_moves = name, SHUFFLES[name]

    def picture_size(self, cell_px: int) -> tuple[int, int]:
        return ROWS * cell_px, (2 * COLS + 1) * cell_px

    def make_env(self, cell_px: int, max_turns: int) -> SlidingBlockEnv:
        return SlidingBlockEnv(self.shuffle_moves, cell_px, max_turns)

    def init_state(self, row: dict) -> dict:
        return {"target": row["target"]}

    def check_row(self, row: dict) -> None:
        target = row.get("target")
        if not isinstance(target, dict) or sorted(target, key=int) != [str(b) for b in sorted(SOLVED)]:
            raise ValueError(f"not a {self.name} row (its target must place blocks 1 to 10)")

    def state_key(self, info: dict) -> tuple:
        return info["positions"]

    def progress(self, info: dict) -> float:
        return info["placed"] / len(SOLVED)

    def make_rows(self, seed_start: int, count: int, max_turns: int, solvable_only: bool = True) -> list[dict]:
        return make_rows(self.name, seed_start, count, max_turns, solvable_only)[0]

    def write_dataset(self, folder: Path, data, max_turns: int) -> dict:
        def make(split: str, start: int, count: int, seed_limit: int | None):
            return make_rows(self.name, start, count, max_turns, data.solvable_only, seed_limit)

        splits = seed_splits(make, data.train_size, data.eval_size, data.train_seed_start, data.eval_seed_start,
                             data.validation_size, data.validation_seed_start)
        folder.mkdir(parents=True, exist_ok=True)
        manifest = {"env_id": self.name, "max_turns": max_turns,
                    "filter": {"solvable_only": data.solvable_only,
                               "rule": "BFS optimal moves + 1 stop <= max_turns" if data.solvable_only else None},
                    "splits": {}}
        return write_splits(folder, manifest, splits)

    def expert_turns(self, row: dict) -> int:
        return row["optimal_moves"] + 1

    def expert_answer(self, env: SlidingBlockEnv) -> str:
        moves = shortest_moves(env.positions, env.target)
        return move_text(*moves[0]) if moves else "<action>stop</action>"

    def random_answer(self, env: SlidingBlockEnv, rng) -> str:
        return move_text(*rng.choice(legal_moves(env.positions)))

    @functools.lru_cache(maxsize=8)
    def env_ceiling(self, max_turns: int) -> float:
        rows, _ = make_rows(self.name, 0, 500, max_turns, solvable_only=False)
        return sum(r["optimal_moves"] + 1 <= max_turns for r in rows) / len(rows)

    def is_hard(self, row: dict) -> bool:
        return row["optimal_moves"] > 1

    def describe(self, row: dict) -> dict:
        return {"optimal_moves": row["optimal_moves"]}
