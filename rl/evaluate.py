"""Evaluation on a fixed set of task rows (greedy by default): solve rate beside the oracle ceiling
(the task's expert under the same turn limit, where it has one), mean turns, invalid-action rate,
one record a row. The rows' own environment (their env_id) says what the ceilings are; rows of
several tasks (a mix's eval set) are also reported task by task."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from envs.registry import get_environment
from inference.requests import Sampling
from rl.rollout import RolloutRunner, task_of
from settings import Config


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
    by_task: dict[str, dict] = field(default_factory=dict)  # env_id -> solve_rate, solved, total, ceilings

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
                f"adapter v{self.adapter_version}") + self.tasks_line()

    def tasks_line(self) -> str:
        """'; task_a 95.3% (61/64), task_b 76.6% (49/64)' where the rows are of several tasks."""
        if len(self.by_task) < 2:
            return ""
        return "; " + ", ".join(f"{env_id} {100 * t['solve_rate']:.1f}% ({t['solved']}/{t['total']})"
                                for env_id, t in self.by_task.items())


def evaluate(runner: RolloutRunner, rows: list[dict], sampling: Sampling, adapter_version: int,
             batch_size: int = 0) -> EvalReport:
    """One episode a row; `batch_size` rows at a time (0: all at once)."""
    tasks = [task_of(row, f"eval-{i}-{row['seed']}", i) for i, row in enumerate(rows)]
    size = batch_size or len(tasks)
    episodes = [ep for i in range(0, len(tasks), size)
                for ep in runner.run(tasks[i:i + size], sampling, adapter_version)]
    per_row = [{"seed": row["seed"], "env_id": row["env_id"], "solved": ep.solved, "turns": len(ep.turns),
                "stop_reason": ep.stop_reason, **get_environment(row["env_id"]).describe(row),
                "invalid_actions": ep.invalid_actions, "answers": [t.text for t in ep.turns]}
               for row, ep in zip(rows, episodes)]
    by_task = {env_id: _outcome([(r, ep) for r, ep in zip(rows, episodes) if r["env_id"] == env_id], runner.max_turns)
               for env_id in dict.fromkeys(r["env_id"] for r in rows)}
    whole = _outcome(list(zip(rows, episodes)), runner.max_turns)
    turns = sum(len(ep.turns) for ep in episodes)
    return EvalReport(**whole, mean_turns=turns / len(rows),
                      invalid_action_rate=sum(ep.invalid_actions for ep in episodes) / max(turns, 1),
                      adapter_version=adapter_version, per_row=per_row, by_task=by_task if len(by_task) > 1 else {})


def _outcome(played: list, max_turns: int) -> dict:
    """Solve rate and ceilings of (row, episode) pairs; the env's ceiling only where they are of one task."""
    solved = sum(ep.solved for _, ep in played)
    expert = [get_environment(r["env_id"]).expert_turns(r) for r, _ in played]
    env_ids = {r["env_id"] for r, _ in played}
    return {"solve_rate": solved / len(played), "solved": solved, "total": len(played),
            "oracle_ceiling": None if None in expert else sum(n <= max_turns for n in expert) / len(played),
            "env_ceiling": get_environment(env_ids.pop()).env_ceiling(max_turns) if len(env_ids) == 1 else None}


def evaluation_sampling(cfg: Config) -> Sampling:
    """generator.eval_sampling_params (greedy by default)."""
    p = cfg.generator.eval_sampling_params
    return Sampling(max_new_tokens=p.max_generate_length, temperature=p.temperature)
