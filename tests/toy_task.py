"""A task of a user's own, outside envs/: registered by import path (environment.env_class=
tests.toy_task:CountTask). The picture shows 1 to 4 white squares; answer their number to win."""
from __future__ import annotations

import json

import gymnasium as gym
import numpy as np

from envs.base import Environment


class CountEnv(gym.Env):
    def __init__(self, side: int, max_turns: int):
        self.side, self.max_turns = side, max_turns
        self.observation_space = gym.spaces.Box(0, 255, (side, side, 3), np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.count, self.turn = int((options or {})["init_state"]["count"]), 0
        return self._picture(), {"feedback": "", "valid_action": True, "turn": 0}

    def step(self, answer):
        self.turn += 1
        valid = str(answer).strip() in {"1", "2", "3", "4"}
        reward = float(valid and int(answer) == self.count)
        feedback = "Right." if reward else ("Count again." if valid else "Answer a number from 1 to 4.")
        info = {"feedback": feedback, "valid_action": valid, "turn": self.turn}
        return self._picture(), reward, bool(reward), not reward and self.turn >= self.max_turns, info

    def _picture(self):
        image = np.zeros((self.side, self.side, 3), np.uint8)
        for k in range(self.count):
            image[2:6, 2 + 8 * k:6 + 8 * k] = 255
        return image


class CountTask(Environment):
    instruction = "How many white squares? Answer with the number."

    def picture_size(self, cell_px: int) -> tuple[int, int]:
        return 4 * cell_px, 4 * cell_px

    def make_env(self, cell_px: int, max_turns: int) -> CountEnv:
        return CountEnv(4 * cell_px, max_turns)

    def init_state(self, row: dict) -> dict:
        return {"count": row["count"]}

    def check_row(self, row: dict) -> None:
        if row.get("count") not in (1, 2, 3, 4):
            raise ValueError(f"not a {self.name} row (count must be 1 to 4)")

    def state_key(self, info: dict) -> int:
        return info["turn"]

    def write_dataset(self, folder, data, max_turns: int) -> dict:
        folder.mkdir(parents=True, exist_ok=True)
        for split, size, start in (("train", data.train_size, data.train_seed_start),
                                   ("eval", data.eval_size, data.eval_seed_start)):
            rows = [{"seed": s, "env_id": self.name, "count": 1 + s % 4} for s in range(start, start + size)]
            (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        manifest = {"env_id": self.name, "max_turns": max_turns}
        (folder / "manifest.json").write_text(json.dumps(manifest))
        return manifest
