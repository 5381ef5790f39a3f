"""The environment interface: everything the training loop, the env pool and the evaluation know
about a task. A task is a family of gymnasium environments with rows of fixed instances (a
dataset); rl/ and actors/ see only this class, never a maze.

A row is a JSON object with at least `seed` and `env_id`; the rest is the task's own. The
gymnasium env a task makes must take `reset(seed=..., options={"init_state": init_state(row)})`
and `step(answer)` with the model's answer text, and put `feedback` (the text the agent sees next
turn) and `valid_action` in its info. Register a task of your own by import path:
`environment.env_class=my_package.my_module:MyTask` (a subclass of Environment; envs/registry.py).
"""
from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path

import gymnasium as gym


class Environment:
    name: str = ""          # the value of environment.env_class that selects it
    instruction: str = ""   # what the agent is told once, before the first picture
    # whether write_dataset can move train starts off a route (data.junction_start_share and
    # data.detour_start_share): a maze's route has junctions and wrong branches
    route_starts: bool = False

    def parts(self) -> list["Environment"]:
        """The tasks whose rows this environment holds: itself, or each task of a mix (envs/mix.py)."""
        return [self]

    def picture_size(self, cell_px: int) -> tuple[int, int]:
        """(height, width) in pixels of the picture the env renders at `environment.cell_px`."""
        raise NotImplementedError

    def make_env(self, cell_px: int, max_turns: int) -> gym.Env:
        raise NotImplementedError

    def init_state(self, row: dict) -> dict:
        """What reset(options={"init_state": ...}) needs to rebuild the row's instance."""
        raise NotImplementedError

    def check_row(self, row: dict) -> None:
        """Raise ValueError naming what a row of this task lacks."""
        raise NotImplementedError

    def state_key(self, info: dict) -> Hashable:
        """The part of the env's state after a step that GiGPO's step-level groups compare (turns of
        one group's episodes that start from equal keys are one step group)."""
        raise NotImplementedError

    def progress(self, info: dict) -> float:
        """How near the env's state after a step is to the goal, from 0 to 1 (GiGPO's
        `progress_reward` shapes the step-level rewards with it); 0 where the task says nothing."""
        return 0.0

    def make_rows(self, seed_start: int, count: int, max_turns: int, solvable_only: bool = True) -> list[dict]:
        """`count` rows from seeds upwards of `seed_start`; with solvable_only, only instances the
        expert finishes within max_turns."""
        raise NotImplementedError

    def write_dataset(self, folder: Path, data, max_turns: int) -> dict:
        """Write train.jsonl, eval.jsonl (and validation.jsonl) and manifest.json for settings.DataConfig
        `data`; return the manifest."""
        raise NotImplementedError

    # ---- the expert and the ceilings: tasks without an expert keep these defaults ---------------
    def expert_turns(self, row: dict) -> int | None:
        """Turns the expert needs to solve the row (its last action included), or None."""
        return None

    def expert_answer(self, env: gym.Env) -> str | None:
        """The expert's next answer on a live env of make_env (the supervised recipe imitates it)."""
        return None

    def random_answer(self, env: gym.Env, rng) -> str:
        """A random action's answer (`rng`: random.Random): the supervised recipe's exploration noise."""
        raise NotImplementedError

    def env_ceiling(self, max_turns: int) -> float | None:
        """The expert's solve rate on unfiltered random instances within max_turns, or None."""
        return None

    def is_hard(self, row: dict) -> bool:
        """Harder than the task's easiest instances (data.long_route_repeats repeats these)."""
        return False

    def describe(self, row: dict) -> dict:
        """What an eval record keeps about the row beside its outcome."""
        return {}


class StopToWinEnv(gym.Env):
    """The turn rules the VisGym tasks here share: one action a turn; `stop` ends the episode and
    pays 1.0 only where the goal is reached; an answer that holds no action uses up the turn with
    `invalid_feedback`; after `max_turns` turns the episode is truncated. A task supplies how an
    answer parses, what an action does, the goal test, the picture and the info."""
    invalid_feedback = "Invalid action."
    stopped_feedback = ("Stopped on the goal.", "Stopped away from the goal.")
    max_turns: int
    turn: int
    feedback: str

    def parse(self, answer):
        """The action an answer holds: "stop", a task action, or None."""
        raise NotImplementedError

    def act(self, action) -> str:
        """Apply a task action; returns the feedback the agent sees next turn."""
        raise NotImplementedError

    def at_goal(self) -> bool:
        raise NotImplementedError

    def started(self) -> bool:
        raise NotImplementedError

    def observation(self):
        raise NotImplementedError

    def info(self, valid: bool) -> dict:
        raise NotImplementedError

    def step(self, answer):
        if not self.started():
            raise RuntimeError("call reset() before step()")
        action = self.parse(answer)
        self.turn += 1
        terminated, reward = False, 0.0
        if action is None:
            self.feedback = self.invalid_feedback
        elif action == "stop":
            terminated = True
            reward = 1.0 if self.at_goal() else 0.0
            self.feedback = self.stopped_feedback[0 if reward else 1]
        else:
            self.feedback = self.act(action)
        truncated = not terminated and self.turn >= self.max_turns
        return self.observation(), reward, terminated, truncated, self.info(valid=action is not None)
