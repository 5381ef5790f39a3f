"""learning_curve.png: eval (and validation) solve rate and train reward by step, with the base
model's rate and the oracle ceiling as reference lines, and the one-line summary printed at the
end of a run."""
from __future__ import annotations

from pathlib import Path


def eval_points(history: list[dict], key: str = "eval/all/avg_score") -> list[tuple[int, float]]:
    return [(h["step"], h[key]) for h in history if key in h]


def chosen_step(history: list[dict]) -> int | None:
    """The step whose adapter the validation set chose last (None without a validation set)."""
    return next((int(h["eval/validation/best_step"]) for h in reversed(history) if "eval/validation/best_step" in h), None)


def summary_line(history: list[dict]) -> str:
    points = eval_points(history)
    if not points:
        return "no evaluation was run"
    base = points[0][1]
    best_step, best = max(points, key=lambda p: (p[1], -p[0]))
    last_step, last = points[-1]
    line = (f"solve rate: baseline {100 * base:.1f}% -> best {100 * best:.1f}% (step {best_step}), "
            f"final {100 * last:.1f}% (step {last_step})")
    chosen = chosen_step(history)
    if chosen is not None:
        line += f"; chosen by validation: step {chosen}, {100 * dict(points)[chosen]:.1f}%"
    return line + "".join(f"\n  {task}: baseline {100 * p[0][1]:.1f}% -> final {100 * p[-1][1]:.1f}% (step {p[-1][0]})"
                          for task, p in task_points(history).items())


def task_points(history: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Each task's eval solve rates in a run of several tasks (eval/task/<env_id>/avg_score)."""
    prefix, suffix = "eval/task/", "/avg_score"
    tasks = dict.fromkeys(k[len(prefix):-len(suffix)] for h in history for k in h
                          if k.startswith(prefix) and k.endswith(suffix))
    return {task: eval_points(history, f"{prefix}{task}{suffix}") for task in tasks}


def plot_learning_curve(history: list[dict], out_path: str, oracle_ceiling: float | None = None,
                        env_ceiling: float | None = None) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = eval_points(history)
    train = [(h["step"], h["reward/avg_raw_reward"]) for h in history if "reward/avg_raw_reward" in h]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    if train:
        ax.plot(*zip(*train), color="tab:blue", alpha=0.55, label="train reward (mean)")
    if points:
        ax.plot(*zip(*points), "o-", color="tab:green", label="eval solve rate (greedy)")
        ax.axhline(points[0][1], color="grey", ls="--", lw=1, label=f"start (step {points[0][0]}) {100 * points[0][1]:.1f}%")
    validation = eval_points(history, "eval/validation/avg_score")
    if validation:
        ax.plot(*zip(*validation), "s:", ms=3, color="tab:purple", label="validation solve rate (chooses the adapter)")
    if oracle_ceiling is not None:
        ax.axhline(oracle_ceiling, color="black", ls=":", lw=1, label=f"oracle ceiling, eval set {100 * oracle_ceiling:.1f}%")
    if env_ceiling is not None and env_ceiling != oracle_ceiling:
        ax.axhline(env_ceiling, color="tab:red", ls=":", lw=1,
                   label=f"oracle ceiling, unfiltered mazes {100 * env_ceiling:.1f}%")
    ax.set_xlabel("step")
    ax.set_ylabel("rate")
    ax.set_ylim(-0.02, 1.05)
    ax.set_title(summary_line(history), fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path)
    plt.close(fig)
    return out_path
