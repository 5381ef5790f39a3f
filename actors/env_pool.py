"""EnvPool: many episodes of one environment, reset and stepped in one call each (lists in, lists out).

Thousands of concurrent episodes cost one Ray call a turn. Each episode is keyed by an id; a bad
answer from one episode becomes feedback for that episode alone. Ids the pool does not hold are
rejected before anything is stepped, so a caller's bug cannot half-apply a turn. The pool hosts
any environment the registry names (envs/registry.py), a mix of tasks too: each episode is reset as
its row's task (`env_ids`) and stays it. Each result carries the task's `state_key`, the state that
GiGPO's step groups compare.
"""
from __future__ import annotations

import random

import gymnasium as gym

from envs.base import Environment
from envs.registry import get_environment


class EnvPool:
    def __init__(self, env_id: str, cell_px: int = 32, max_turns: int = 15):
        self.environment = get_environment(env_id)
        self.tasks = {task.name: task for task in self.environment.parts()}
        self.env_id, self.cell_px, self.max_turns = env_id, cell_px, max_turns
        self._envs: dict[str, tuple[Environment, gym.Env]] = {}  # episode id -> (its task, its env)
        self._done: set[str] = set()

    def reset(self, episode_ids: list[str], seeds: list[int | None] | None = None,
              init_states: list[dict | None] | None = None, env_ids: list[str] | None = None) -> list[dict]:
        """Start (or restart) episodes, each as the task its `env_ids` entry names (the pool's own
        environment where None); returns one {episode_id, image, info, state_key} per id."""
        seeds = seeds or [None] * len(episode_ids)
        init_states = init_states or [None] * len(episode_ids)
        env_ids = env_ids or [self.env_id] * len(episode_ids)
        if not len(episode_ids) == len(seeds) == len(init_states) == len(env_ids):
            raise ValueError("episode_ids, seeds, init_states and env_ids must have the same length")
        unknown = sorted(set(env_ids) - set(self.tasks))
        if unknown:
            raise ValueError(f"episodes of {', '.join(unknown)}, but this pool hosts {', '.join(self.tasks)}")
        out = []
        for eid, seed, state, env_id in zip(episode_ids, seeds, init_states, env_ids):
            task = self.tasks[env_id]
            held = self._envs.get(eid)
            env = held[1] if held and held[0] is task else task.make_env(self.cell_px, self.max_turns)
            self._envs[eid] = (task, env)
            self._done.discard(eid)
            image, info = env.reset(seed=seed, options={"init_state": state} if state else None)
            out.append({"episode_id": eid, "image": image, "info": info, "state_key": task.state_key(info),
                        "progress": task.progress(info)})
        return out

    def step(self, episode_ids: list[str], answers: list) -> list[dict]:
        """One turn for each listed episode: {episode_id, image, reward, terminated, truncated, info, state_key,
        progress}."""
        if len(episode_ids) != len(answers):
            raise ValueError(f"{len(episode_ids)} episode ids but {len(answers)} answers")
        unknown = [e for e in episode_ids if e not in self._envs]
        finished = [e for e in episode_ids if e in self._done]
        if unknown or finished:
            raise ValueError(f"cannot step episodes: unknown {unknown[:5]}, already finished {finished[:5]}")
        out = []
        for eid, answer in zip(episode_ids, answers):
            task, env = self._envs[eid]
            image, reward, terminated, truncated, info = env.step(answer)
            if terminated or truncated:
                self._done.add(eid)
            out.append({"episode_id": eid, "image": image, "reward": reward, "terminated": terminated,
                        "truncated": truncated, "info": info, "state_key": task.state_key(info),
                        "progress": task.progress(info)})
        return out

    def random_answers(self, episode_ids: list[str], seeds: list[int]) -> list[str]:
        """A random action's answer for each listed live episode (its task's `random_answer`, drawn
        by `random.Random(seed)`): the rollouts' exploration (generator.explore_revisits)."""
        unknown = [e for e in episode_ids if e not in self._envs or e in self._done]
        if unknown:
            raise ValueError(f"no live episodes {unknown[:5]}")
        return [self._envs[eid][0].random_answer(self._envs[eid][1], random.Random(seed))
                for eid, seed in zip(episode_ids, seeds)]

    def close(self, episode_ids: list[str] | None = None) -> int:
        """Forget episodes (all when None); returns how many are still held."""
        for eid in list(self._envs) if episode_ids is None else episode_ids:
            self._envs.pop(eid, None)
            self._done.discard(eid)
        return len(self._envs)

    def size(self) -> int:
        return len(self._envs)
