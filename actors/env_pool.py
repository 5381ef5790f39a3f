"""EnvPool: many episodes of one environment, reset and stepped in one call each (lists in, lists out).

Thousands of concurrent episodes cost one Ray call a turn. Each episode is keyed by an id; a bad
answer from one episode becomes feedback for that episode alone. Ids the pool does not hold are
rejected before anything is stepped, so a caller's bug cannot half-apply a turn. The pool hosts
any environment the registry names (envs/registry.py); each result carries the env's `state_key`,
the state that GiGPO's step groups compare.
"""
from __future__ import annotations

import gymnasium as gym

from envs.registry import get_environment


class EnvPool:
    def __init__(self, env_id: str, cell_px: int = 32, max_turns: int = 15):
        self.environment = get_environment(env_id)
        self.env_id, self.cell_px, self.max_turns = env_id, cell_px, max_turns
        self._envs: dict[str, gym.Env] = {}
        self._done: set[str] = set()

    def reset(self, episode_ids: list[str], seeds: list[int | None] | None = None,
              init_states: list[dict | None] | None = None) -> list[dict]:
        """Start (or restart) episodes; returns one {episode_id, image, info, state_key} per id."""
        seeds = seeds or [None] * len(episode_ids)
        init_states = init_states or [None] * len(episode_ids)
        if not len(episode_ids) == len(seeds) == len(init_states):
            raise ValueError("episode_ids, seeds and init_states must have the same length")
        out = []
        for eid, seed, state in zip(episode_ids, seeds, init_states):
            env = self._envs.get(eid) or self.environment.make_env(self.cell_px, self.max_turns)
            self._envs[eid] = env
            self._done.discard(eid)
            image, info = env.reset(seed=seed, options={"init_state": state} if state else None)
            out.append({"episode_id": eid, "image": image, "info": info,
                        "state_key": self.environment.state_key(info)})
        return out

    def step(self, episode_ids: list[str], answers: list) -> list[dict]:
        """One turn for each listed episode: {episode_id, image, reward, terminated, truncated, info, state_key}."""
        if len(episode_ids) != len(answers):
            raise ValueError(f"{len(episode_ids)} episode ids but {len(answers)} answers")
        unknown = [e for e in episode_ids if e not in self._envs]
        finished = [e for e in episode_ids if e in self._done]
        if unknown or finished:
            raise ValueError(f"cannot step episodes: unknown {unknown[:5]}, already finished {finished[:5]}")
        out = []
        for eid, answer in zip(episode_ids, answers):
            image, reward, terminated, truncated, info = self._envs[eid].step(answer)
            if terminated or truncated:
                self._done.add(eid)
            out.append({"episode_id": eid, "image": image, "reward": reward, "terminated": terminated,
                        "truncated": truncated, "info": info, "state_key": self.environment.state_key(info)})
        return out

    def close(self, episode_ids: list[str] | None = None) -> int:
        """Forget episodes (all when None); returns how many are still held."""
        for eid in list(self._envs) if episode_ids is None else episode_ids:
            self._envs.pop(eid, None)
            self._done.discard(eid)
        return len(self._envs)

    def size(self) -> int:
        return len(self._envs)
