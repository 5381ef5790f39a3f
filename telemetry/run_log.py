"""Per-run logging: one JSON line per step, the same values as TensorBoard scalars and as
Ray metrics (Prometheus: telemetry/prometheus.py).

Metric names follow SkyRL's (`policy/policy_loss`, `reward/avg_raw_reward`, `timing/generate`,
`eval/all/avg_score`, ...). A resumed run keeps what was logged up to the step it resumed from
(the values of the run that made that checkpoint) and drops the rest, which it redoes; a fresh run
starts empty. A checkpoint keeps its own step's line, so a run stopped between the save and the line
gets the line back. So the history never holds a step twice, nor a gap.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from storage.atomic import write_atomic
from telemetry.prometheus import PrometheusExporter
from telemetry.trackers import open_tracker


def read_metrics(run_dir: Path) -> list[dict]:
    """The steps a run's metrics.jsonl holds, in order (none if it has not logged yet)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def log_line(metrics: dict) -> dict:
    """What metrics.jsonl keeps of a step's metrics: numbers as floats, the per-sample `samples/` lists
    left to the Prometheus histograms."""
    return {k: (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v)
            for k, v in metrics.items() if not k.startswith("samples/")}


class RunLog:
    def __init__(self, run_dir: str, keep_through_step: int = -1, logger: str | list[str] = "tensorboard",
                 prometheus: bool = True, project: str = "visrl", run_name: str = "default", config: dict | None = None,
                 tracker_ids: dict | None = None, saved_line: dict | None = None):
        """keep_through_step: the step a resumed run restarts after (-1: a fresh run, keep nothing);
        saved_line: that step's line as its checkpoint kept it (see `rewind`);
        logger: trainer.logger, names of tensorboard, console, mlflow, wandb (telemetry/trackers.py);
        tracker_ids: {tracker: run id} of the run being resumed (from its checkpoint), continued."""
        loggers = [logger] if isinstance(logger, str) else list(logger)
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self.tensorboard, self.tb = "tensorboard" in loggers, None
        self.exporter = PrometheusExporter(run_name) if prometheus else None
        opened = {k: open_tracker(k, self.dir, project, run_name, config or {}, (tracker_ids or {}).get(k)) for k in loggers}
        self.trackers = {k: t for k, t in opened.items() if t is not None}
        self.rewind(keep_through_step, saved_line)

    def tracker_ids(self) -> dict:
        """{tracker: run id}: what a checkpoint keeps so that a resumed run continues the same runs."""
        return {k: t.id for k, t in self.trackers.items()}

    def _truncate_after(self, step: int) -> set[int]:
        """Drop the lines after `step`; the steps kept."""
        if not self.path.exists():
            return set()
        keep = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        write_atomic(self.path, "".join(line + "\n" for line in keep))
        return {json.loads(line).get("step", 0) for line in keep}

    def rewind(self, step: int, saved_line: dict | None = None) -> None:
        """Drop what was logged after `step` (it will be redone), in metrics.jsonl and TensorBoard.
        `saved_line`: the line of `step` as its checkpoint kept it, logged again if the run stopped
        after the save and before the line was written (it lacks what came after the save: ckpt/*)."""
        kept = self._truncate_after(step)
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.tensorboard:
            from torch.utils.tensorboard import SummaryWriter
            self.tb = SummaryWriter(str(self.dir / "tensorboard"), purge_step=step + 1)
        if saved_line is not None and step > 0 and step not in kept:
            print(f"step {step}'s metrics line, lost when the run stopped after its checkpoint, taken from the "
                  f"checkpoint", flush=True)
            self.log(step, saved_line)

    def log(self, step: int, metrics: dict) -> None:
        """One step's metrics; keys under `samples/` hold per-episode or per-turn values, which go to the
        Prometheus histograms only."""
        samples = {k: v for k, v in metrics.items() if k.startswith("samples/")}
        clean = log_line(metrics)
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": step, **clean}, sort_keys=True) + "\n")
        numbers = {k: v for k, v in clean.items()
                   if isinstance(v, float) and math.isfinite(v) and k != "time"}  # time: wall clock, not a metric
        if self.tb is not None:
            for k, v in numbers.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.exporter is not None:
            self.exporter.observe(numbers, samples)
        for tracker in self.trackers.values():
            tracker.log(step, numbers)

    def history(self) -> list[dict]:
        return read_metrics(self.dir)

    def close(self, curve: Path | None = None) -> None:
        """`curve`: the learning curve's picture, for the tracker."""
        if self.tb is not None:
            self.tb.close()
        if self.exporter is not None:
            self.exporter.close()
        for tracker in self.trackers.values():
            tracker.finish(curve)
