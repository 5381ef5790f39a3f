"""Evaluation on a fixed set of task rows (greedy by default): solve rate beside the oracle ceiling
(the task's expert under the same turn limit, where it has one), mean turns, invalid-action rate,
one record a row. The rows' own environment (their env_id) says what the ceilings are."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from envs.registry import get_environment
from inference.requests import Sampling
from rl.rollout import RolloutRunner, Task


@dataclass
class EvalReport:
    solve_rate: float
    solved: int
    total: int
    oracle_ceiling: float | None   # the expert on these rows (100% on a set filtered to solvable ones)
    env_ceiling: float | None      # the expert on random unfiltered instances of the env, at this max_turns
    mean_turns: float
    invalid_action_rate: float
    adapter_version: int
    per_row: list[dict] = field(default_factory=list)

    def summary(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "per_row"}

    def write(self, path: Path) -> None:
        """One JSON line a row (answers, turns, stop reason)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(m) + "\n" for m in self.per_row))

    def line(self) -> str:
        ceiling = "" if self.oracle_ceiling is None else f", oracle ceiling {100 * self.oracle_ceiling:.1f}% on this set"
        if self.env_ceiling is not None:
            ceiling += f" ({100 * self.env_ceiling:.1f}% on unfiltered instances of the env)"
        return (f"solve rate {100 * self.solve_rate:.1f}% ({self.solved}/{self.total}){ceiling}, mean turns "
                f"{self.mean_turns:.1f}, invalid actions {100 * self.invalid_action_rate:.1f}%, "
                f"adapter v{self.adapter_version}")


def evaluate(runner: RolloutRunner, rows: list[dict], sampling: Sampling, adapter_version: int,
             batch_size: int = 0) -> EvalReport:
    """One episode a row; `batch_size` rows at a time (0: all at once). The rows are of one environment."""
    environment = get_environment(rows[0]["env_id"])
    tasks = [Task(f"eval-{i}-{row['seed']}", i, environment.init_state(row), row["seed"]) for i, row in enumerate(rows)]
    size = batch_size or len(tasks)
    episodes = [ep for i in range(0, len(tasks), size)
                for ep in runner.run(tasks[i:i + size], sampling, adapter_version)]
    per_row = [{"seed": row["seed"], "solved": ep.solved, "turns": len(ep.turns), "stop_reason": ep.stop_reason,
                 **environment.describe(row), "invalid_actions": ep.invalid_actions,
                 "answers": [t.text for t in ep.turns]} for row, ep in zip(rows, episodes)]
    solved = sum(ep.solved for ep in episodes)
    turns = sum(len(ep.turns) for ep in episodes)
    expert = [environment.expert_turns(r) for r in rows]
    ceiling = None if None in expert else sum(n <= runner.max_turns for n in expert) / len(rows)
    return EvalReport(solve_rate=solved / len(rows), solved=solved, total=len(rows), oracle_ceiling=ceiling,
                      env_ceiling=environment.env_ceiling(runner.max_turns),
                      mean_turns=turns / len(rows),
                      invalid_action_rate=sum(ep.invalid_actions for ep in episodes) / max(turns, 1),
                      adapter_version=adapter_version, per_row=per_row)


def evaluation_sampling(cfg) -> Sampling:
    """generator.eval_sampling_params (greedy by default; cfg: settings.Config)."""
    p = cfg.generator.eval_sampling_params
    return Sampling(max_new_tokens=p.max_generate_length, temperature=p.temperature)
