"""The train-set dataloader: prompts shuffled per epoch by seed, with a position that a
checkpoint saves and a resume restores exactly (no fresh prompt skipped, none drawn fresh twice).

With `data.replay_share` it also replays (prioritised level replay, simplified): a maze whose
group came back mixed (some episodes solved it, some not) is queued, and up to that share of each
later batch is drawn from the queue, fewest solved first. A mixed group is one that carries a
gradient; late in a run most fresh mazes come back all solved and carry none."""
from __future__ import annotations

import numpy as np

from envs.registry import get_environment

MAX_REPLAYS = 2  # a maze still mixed after this many replays gives way to newer ones


def repeat_long_routes(rows: list[dict], repeats: int) -> list[dict]:
    """The train rows with each row its environment calls hard (a maze whose route is longer than
    its env's shortest) `repeats` times (data.long_route_repeats): the hard rows are where a trained
    agent still fails, and a group whose episodes all succeed carries no signal."""
    return [r for r in rows for _ in range(repeats if get_environment(r["env_id"]).is_hard(r) else 1)]


class PromptSampler:
    def __init__(self, rows: list[dict], batch_size: int, seed: int, replay_share: float = 0.0):
        if batch_size > len(rows):
            raise ValueError(f"batch of {batch_size} prompts from a train set of {len(rows)}")
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self.replay_slots = round(replay_share * batch_size)
        self.reset()

    def reset(self) -> None:
        """Back to the first batch of epoch 0, nothing queued."""
        self.epoch, self.position = 0, 0     # position: rows of this epoch's order handed out
        self.queue: list[dict] = []          # {"row", "solved", "replays"}, in the order they were queued
        self.last: list[tuple[int, int]] = []  # (row index, replays so far) of the last batch

    @property
    def steps_per_epoch(self) -> int:
        return len(self.rows) // self.batch_size  # the last partial batch of an epoch is dropped

    def _order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))

    def next_batch(self) -> tuple[list[dict], int]:
        """(rows, epoch) of the next step: the replayed mazes first, then fresh ones in the epoch's
        order; moves to the next epoch when fewer fresh rows are left than the batch needs."""
        self.queue.sort(key=lambda q: q["solved"])  # stable: among equals, the longest queued first
        replayed, self.queue = self.queue[:self.replay_slots], self.queue[self.replay_slots:]
        fresh = self.batch_size - len(replayed)
        if self.position + fresh > self.steps_per_epoch * self.batch_size:
            self.epoch, self.position = self.epoch + 1, 0
        order = self._order(self.epoch)[self.position:self.position + fresh]
        self.position += fresh
        self.last = [(q["row"], q["replays"] + 1) for q in replayed] + [(int(i), 0) for i in order]
        return [self.rows[i] for i, _ in self.last], self.epoch

    def record_outcomes(self, episodes) -> None:
        """The last batch's episodes (rl.rollout.Episode: `group` is the row's place in the batch): a
        maze whose group came back mixed is queued for replay (when replay is on)."""
        if not self.replay_slots:
            return
        solved = [[] for _ in self.last]
        for ep in episodes:
            solved[ep.group].append(ep.solved)
        for (row, replays), group in zip(self.last, solved):
            if 0 < sum(group) < len(group) and replays < MAX_REPLAYS:
                self.queue.append({"row": row, "solved": sum(group) / len(group), "replays": replays})

    @property
    def replayed(self) -> int:
        """How many of the last batch's mazes were replays."""
        return sum(replays > 0 for _, replays in self.last)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "batch_size": self.batch_size,
                "rows": len(self.rows), "replay_queue": self.queue}

    def load_state_dict(self, state: dict) -> None:
        if state["rows"] != len(self.rows) or state["batch_size"] != self.batch_size:
            raise ValueError(f"checkpoint's dataloader saw {state['rows']} rows in batches of {state['batch_size']}; "
                             f"this run has {len(self.rows)} in batches of {self.batch_size}")
        # checkpoints from before replay counted whole batches ("cursor")
        position = state["position"] if "position" in state else int(state["cursor"]) * self.batch_size
        self.epoch, self.position, self.seed = int(state["epoch"]), int(position), int(state["seed"])
        self.queue = [dict(q) for q in state.get("replay_queue", [])]
