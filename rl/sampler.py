"""The train-set dataloader: prompts shuffled per epoch by seed, with a position that a
checkpoint saves and a resume restores exactly (no prompt skipped, none seen twice)."""
from __future__ import annotations

import numpy as np

from envs.dataset import shortest_route


def repeat_long_routes(rows: list[dict], repeats: int) -> list[dict]:
    """The train rows with each maze whose route is longer than its env's shortest `repeats` times
    (data.long_route_repeats): the long mazes are where a trained agent still fails, and a group
    whose episodes all succeed carries no signal."""
    return [r for r in rows for _ in range(repeats if r["optimal_moves"] > shortest_route(r["env_id"]) else 1)]


class PromptSampler:
    def __init__(self, rows: list[dict], batch_size: int, seed: int):
        if batch_size > len(rows):
            raise ValueError(f"batch of {batch_size} prompts from a train set of {len(rows)}")
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.epoch, self.cursor = 0, 0

    @property
    def steps_per_epoch(self) -> int:
        return len(self.rows) // self.batch_size  # the last partial batch of an epoch is dropped

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))

    def next_batch(self) -> tuple[list[dict], int]:
        """(rows, epoch) of the next step; moves to the next epoch when this one is used up."""
        if self.cursor >= self.steps_per_epoch:
            self.epoch, self.cursor = self.epoch + 1, 0
        idx = self._order(self.epoch)[self.cursor * self.batch_size:(self.cursor + 1) * self.batch_size]
        self.cursor += 1
        return [self.rows[i] for i in idx], self.epoch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "seed": self.seed, "batch_size": self.batch_size,
                "rows": len(self.rows)}

    def load_state_dict(self, state: dict) -> None:
        if state["rows"] != len(self.rows) or state["batch_size"] != self.batch_size:
            raise ValueError(f"checkpoint's dataloader saw {state['rows']} rows in batches of {state['batch_size']}; "
                             f"this run has {len(self.rows)} in batches of {self.batch_size}")
        self.epoch, self.cursor, self.seed = int(state["epoch"]), int(state["cursor"]), int(state["seed"])
