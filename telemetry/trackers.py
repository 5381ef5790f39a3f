"""Experiment trackers beside metrics.jsonl: MLflow and Weights & Biases (`trainer.logger`), logging
what SkyRL's tracker logs: the config at the start, every step's numbers, the learning curve at the end.

- mlflow: the run goes to MLFLOW_TRACKING_URI (an MLflow server), else to a file store in
  `<run_dir>/mlruns` (`mlflow ui --backend-store-uri <run_dir>/mlruns`); experiment
  `trainer.project_name`, run `trainer.run_name`.
- wandb: project `trainer.project_name`, run `trainer.run_name`, files under `<run_dir>/wandb`;
  WANDB_API_KEY for the service, or WANDB_MODE=offline to keep the run on disk (`wandb sync` later).
Several at once (`trainer.logger=[tensorboard,mlflow,wandb]`). Each tracker's run id is kept with the
run's checkpoints, so a resumed run logs into the same MLflow run and the same W&B run (resumed),
its steps continuing where the checkpoint left off.
"""
from __future__ import annotations

import os
from pathlib import Path


class MLflowTracker:
    def __init__(self, run_dir: Path, project: str, run_name: str, config: dict, run_id: str | None = None):
        import mlflow
        self.mlflow = mlflow
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        own_store = not uri
        if own_store:  # a store in the run folder: MLflow keeps its file store for those who ask for it
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow.set_tracking_uri(uri)
        if own_store:  # set_tracking_uri also exports it: later runs and child processes would log here
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        mlflow.set_experiment(project)
        if run_id:  # a resumed run: the same MLflow run, its params already there
            self.run = mlflow.start_run(run_id=run_id)
        else:
            self.run = mlflow.start_run(run_name=run_name)
            mlflow.log_params({k: str(v)[:500] for k, v in flatten(config).items()})
            mlflow.log_dict(config, "config.yaml")
        self.id = self.run.info.run_id

    def log(self, step: int, numbers: dict) -> None:
        self.mlflow.log_metrics(numbers, step=step)

    def finish(self, curve: Path | None) -> None:
        if curve is not None and curve.exists():
            self.mlflow.log_artifact(str(curve))
        self.mlflow.end_run()


class WandbTracker:
    def __init__(self, run_dir: Path, project: str, run_name: str, config: dict, run_id: str | None = None):
        import wandb
        self.wandb = wandb
        resume = {"id": run_id, "resume": "allow"} if run_id else {}  # a resumed run: the same W&B run
        self.run = wandb.init(project=project, name=run_name, config=config, dir=str(run_dir), reinit="finish_previous",
                              **resume)
        self.id = self.run.id

    def log(self, step: int, numbers: dict) -> None:
        self.run.log(numbers, step=step)

    def finish(self, curve: Path | None) -> None:
        if curve is not None and curve.exists():
            self.run.log({"learning_curve": self.wandb.Image(str(curve))})
        self.run.finish()


TRACKERS = {"mlflow": MLflowTracker, "wandb": WandbTracker}


def flatten(node: dict, prefix: str = "") -> dict:
    """{"trainer": {"epochs": 1}} -> {"trainer.epochs": 1}"""
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out |= flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def open_tracker(kind: str, run_dir: Path, project: str, run_name: str, config: dict, run_id: str | None = None):
    """The tracker `kind` (one of trainer.logger's names), continuing run `run_id` when given; None for
    tensorboard and console (RunLog writes those)."""
    if kind not in TRACKERS:
        return None
    try:
        return TRACKERS[kind](Path(run_dir), project, run_name, config, run_id)
    except ImportError as e:
        raise ImportError(f"trainer.logger={kind} needs its package: pip install 'visrl[tracking]' ({e})") from e
