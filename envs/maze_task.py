"""The visual maze (envs/maze.py) behind the environment interface: maze_2d/easy and maze_2d/hard,
and their trail and marks variants (the cells the agent has left tinted; those it walked back out of, green)."""
from __future__ import annotations

from pathlib import Path

from envs.actions import MOVES
from envs.base import Environment
from envs.dataset import env_ceiling, init_state, make_rows, shortest_route, write_dataset
from envs.expert import expert_actions
from envs.maze import MazeEnv
from envs.prompt import INSTRUCTION, action_text

ROW_KEYS = ("seed", "env_id", "maze", "start", "goal")


class MazeTask(Environment):
    instruction = INSTRUCTION
    route_starts = True

    def __init__(self, name: str, size: int, trail: int = 0):
        self.name, self.size, self.trail = name, size, trail

    def picture_size(self, cell_px: int) -> tuple[int, int]:
        return self.size * cell_px, self.size * cell_px

    def make_env(self, cell_px: int, max_turns: int) -> MazeEnv:
        return MazeEnv(self.size, cell_px, max_turns, trail=self.trail)

    def init_state(self, row: dict) -> dict:
        return init_state(row)

    def check_row(self, row: dict) -> None:
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ValueError(f"not a {self.name} row (no {', '.join(missing)})")

    def state_key(self, info: dict) -> tuple:
        return tuple(info["agent"])  # the group already fixes the maze: the agent's cell is the state

    def progress(self, info: dict) -> float:
        """The share of the starting route behind the agent: a move into a dead end loses ground, the
        way back regains it (what `progress_reward` shapes with)."""
        return 1.0 - info["moves_left"] / max(info["start_moves"], 1)

    def make_rows(self, seed_start: int, count: int, max_turns: int, solvable_only: bool = True) -> list[dict]:
        return make_rows(self.name, seed_start, count, max_turns, solvable_only)[0]

    def write_dataset(self, folder: Path, data, max_turns: int) -> dict:
        d = data
        return write_dataset(folder, self.name, d.train_size, d.eval_size, d.train_seed_start, d.eval_seed_start,
                             max_turns, d.solvable_only, d.validation_size, d.validation_seed_start,
                             d.long_route_share, d.junction_start_share, d.detour_start_share)

    def expert_turns(self, row: dict) -> int | None:
        moves = row.get("optimal_moves")
        return None if moves is None else moves + 1  # the BFS route and the stop

    def expert_answer(self, env: MazeEnv) -> str:
        return action_text(expert_actions(env.maze, env.agent, env.target)[0])

    def random_answer(self, env: MazeEnv, rng) -> str:
        return action_text(rng.choice(MOVES))

    def env_ceiling(self, max_turns: int) -> float:
        return env_ceiling(self.name, max_turns)

    def is_hard(self, row: dict) -> bool:
        return row["optimal_moves"] > shortest_route(self.name)

    def describe(self, row: dict) -> dict:
        return {"optimal_moves": row.get("optimal_moves")}
