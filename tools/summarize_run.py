"""Summarize a training run: the learning curve's numbers, wall time, per-phase share of step time.

    python tools/summarize_run.py [runs/default]
"""
import json
import sys
from pathlib import Path


def main():
    run = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/default")
    hist = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(h["step"], h["eval/all/avg_score"]) for h in hist if "eval/all/avg_score" in h]
    steps = [h for h in hist if h["step"] > 0]
    print("eval solve rate by step:", ", ".join(f"{s}: {100 * v:.1f}%" for s, v in evals))
    if evals:
        best = max(evals, key=lambda p: p[1])
        print(f"baseline {100 * evals[0][1]:.1f}% -> best {100 * best[1]:.1f}% (step {best[0]}), "
              f"final {100 * evals[-1][1]:.1f}%")
    total = sum(h.get("timing/step", 0) for h in steps)
    print(f"{len(steps)} steps, {total / 60:.1f} min of step time ({total / max(len(steps), 1):.1f} s a step)")
    phases = {}
    for h in steps:
        for k, v in h.items():
            if k.startswith("timing/") and k != "timing/step":
                phases[k[7:]] = phases.get(k[7:], 0.0) + v
    other = total - sum(phases.values())
    print("| phase | seconds | share of step time |")
    print("|---|---|---|")
    for k, v in sorted(phases.items(), key=lambda kv: -kv[1]) + [("other (driver, advantages, logging)", other)]:
        print(f"| {k} | {v:.0f} | {100 * v / max(total, 1e-9):.1f}% |")


if __name__ == "__main__":
    main()
