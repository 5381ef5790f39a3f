"""Per-step diagnostics, named as SkyRL names them where it has a name."""
from __future__ import annotations

import numpy as np

from rl.rollout import Episode


def rollout_metrics(episodes: list[Episode], advantages: list[np.ndarray], generate_s: float) -> dict:
    """advantages: per episode, one value a turn."""
    rewards = np.array([ep.reward for ep in episodes], dtype=np.float64)
    adv = np.concatenate([np.asarray(a, dtype=np.float64) for a in advantages]) if advantages else np.zeros(1)
    tokens = sum(ep.generated_tokens for ep in episodes)
    turns = sum(len(ep.turns) for ep in episodes)
    groups = {}
    for ep in episodes:
        groups.setdefault(ep.group, []).append(ep.reward)
    out = {
        "reward/avg_raw_reward": float(rewards.mean()),
        "reward/solve_rate": float((rewards > 0).mean()),
        "reward/std": float(rewards.std()),
        "advantages/mean": float(adv.mean()), "advantages/std": float(adv.std()),
        "advantages/min": float(adv.min()), "advantages/max": float(adv.max()),
        "advantages/frac_zero_groups": float(np.mean([len(set(g)) == 1 for g in groups.values()])),
        "generate/avg_num_tokens": tokens / max(len(episodes), 1),
        "generate/avg_turns": turns / max(len(episodes), 1),
        "generate/invalid_action_rate": sum(ep.invalid_actions for ep in episodes) / max(turns, 1),
        "generate/explored_turn_rate": sum(t.explored for ep in episodes for t in ep.turns) / max(turns, 1),
        "generate/tokens_per_s": tokens / max(generate_s, 1e-9),
        # every prompt is prefilled in full each turn: prompt + generated tokens is the work done
        "generate/total_tokens_per_s": (tokens + sum(len(t.prompt_ids) for ep in episodes for t in ep.turns))
        / max(generate_s, 1e-9),
        "generate/episodes_per_min": 60 * len(episodes) / max(generate_s, 1e-9),
    }
    for reason in ("stop", "truncated", "length"):
        out[f"generate/stop_reason_{reason}"] = float(np.mean([ep.stop_reason == reason for ep in episodes]))
    # the distributions themselves, for histograms (telemetry/prometheus.py); not written to metrics.jsonl
    out |= {"samples/return": rewards.tolist(), "samples/advantage": adv.tolist()}
    return out


def eval_metrics(report) -> dict:
    """The eval's numbers; the ceilings only where the task has an expert; with several tasks, each
    task's solve rate as eval/task/<env_id>/avg_score."""
    ceilings = {"eval/all/oracle_ceiling": report.oracle_ceiling, "eval/all/env_ceiling": report.env_ceiling}
    return {"eval/all/avg_score": report.solve_rate, **{k: v for k, v in ceilings.items() if v is not None},
            "eval/all/mean_turns": report.mean_turns, "eval/all/invalid_action_rate": report.invalid_action_rate,
            **{f"eval/task/{env_id}/avg_score": t["solve_rate"] for env_id, t in report.by_task.items()}}
