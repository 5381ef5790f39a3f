"""Evaluation on a fixed maze set (greedy by default): solve rate beside the oracle ceiling (the
BFS expert's rate under the same step limit), mean turns, invalid-action rate, one record a maze."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from envs.dataset import env_ceiling, init_state
from inference.requests import Sampling
from rl.rollout import RolloutRunner, Task


@dataclass
class EvalReport:
    solve_rate: float
    solved: int
    total: int
    oracle_ceiling: float          # the BFS expert on these mazes (100% on a set filtered to solvable ones)
    env_ceiling: float             # the BFS expert on random mazes of the env, unfiltered, at this max_turns
    mean_turns: float
    invalid_action_rate: float
    adapter_version: int
    per_maze: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "per_maze"}

    def write(self, path: Path) -> None:
        """One JSON line a maze (answers, turns, stop reason)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(m) + "\n" for m in self.per_maze))

    def line(self) -> str:
        return (f"solve rate {100 * self.solve_rate:.1f}% ({self.solved}/{self.total}), oracle ceiling "
                f"{100 * self.oracle_ceiling:.1f}% on this set ({100 * self.env_ceiling:.1f}% on unfiltered mazes of "
                f"the env), mean turns {self.mean_turns:.1f}, invalid actions "
                f"{100 * self.invalid_action_rate:.1f}%, adapter v{self.adapter_version}")


def evaluate(runner: RolloutRunner, rows: list[dict], sampling: Sampling, adapter_version: int,
             batch_size: int = 0) -> EvalReport:
    """One episode a maze; `batch_size` mazes at a time (0: all at once)."""
    tasks = [Task(f"eval-{i}-{row['seed']}", i, init_state(row), row["seed"]) for i, row in enumerate(rows)]
    size = batch_size or len(tasks)
    episodes = [ep for i in range(0, len(tasks), size)
                for ep in runner.run(tasks[i:i + size], sampling, adapter_version)]
    per_maze = [{"seed": row["seed"], "solved": ep.solved, "turns": len(ep.turns), "stop_reason": ep.stop_reason,
                 "optimal_moves": row.get("optimal_moves"), "invalid_actions": ep.invalid_actions,
                 "answers": [t.text for t in ep.turns]} for row, ep in zip(rows, episodes)]
    solved = sum(ep.solved for ep in episodes)
    turns = sum(len(ep.turns) for ep in episodes)
    ceiling = sum(r.get("optimal_moves", 0) + 1 <= runner.max_turns for r in rows) / max(len(rows), 1)
    env_id = rows[0]["env_id"] if rows else "maze_2d/easy"
    return EvalReport(solve_rate=solved / max(len(rows), 1), solved=solved, total=len(rows), oracle_ceiling=ceiling,
                      env_ceiling=env_ceiling(env_id, runner.max_turns),
                      mean_turns=turns / max(len(rows), 1),
                      invalid_action_rate=sum(ep.invalid_actions for ep in episodes) / max(turns, 1),
                      adapter_version=adapter_version, per_maze=per_maze)


def evaluation_sampling(cfg) -> Sampling:
    """generator.eval_sampling_params (greedy by default; cfg: settings.Config)."""
    p = cfg.generator.eval_sampling_params
    return Sampling(max_new_tokens=p.max_generate_length, temperature=p.temperature)
