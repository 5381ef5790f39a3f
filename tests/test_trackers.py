"""trainer.logger=mlflow and =wandb: a run's config, every step's numbers and the learning curve,
in a real MLflow file store and a real W&B offline run."""
import json
import os
import time
from pathlib import Path

import pytest

from telemetry.run_log import RunLog

STEPS = [(0, {"eval/all/avg_score": 0.25}), (1, {"reward/avg_raw_reward": 0.5, "policy/policy_loss": -0.1,
                                                 "samples/return": [0.0, 1.0], "time": 1.0}),
         (2, {"reward/avg_raw_reward": 0.75, "policy/policy_loss": -0.2, "eval/all/avg_score": 0.5})]
CONFIG = {"trainer": {"epochs": 1, "run_name": "probe"}, "data": {"train_size": 8}}


def write_curve(run: Path) -> Path:
    from PIL import Image
    Image.new("RGB", (32, 32), "white").save(run / "learning_curve.png")
    return run / "learning_curve.png"


def log_steps(run: Path, logger: str) -> None:
    log = RunLog(str(run), logger=logger, prometheus=False, project="visrl-test", run_name="probe", config=CONFIG)
    for step, metrics in STEPS:
        log.log(step, metrics)
    log.close(write_curve(run))


def test_mlflow_gets_the_config_every_step_and_the_curve(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    log_steps(tmp_path, "mlflow")
    # the run folder's store stays this run's: not exported to later runs or child processes
    assert "MLFLOW_TRACKING_URI" not in os.environ
    log_steps(tmp_path / "second", "mlflow")
    assert (tmp_path / "second" / "mlruns").is_dir()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("visrl-test").experiment_id])
    assert run.info.run_name == "probe" and run.data.params["trainer.epochs"] == "1"
    history = client.get_metric_history(run.info.run_id, "reward/avg_raw_reward")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75)]
    assert "time" not in run.data.metrics and not any(k.startswith("samples/") for k in run.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "learning_curve.png"} <= artifacts


def wandb_records(path: Path):
    """The protobuf records of an offline run's .wandb file: a 7-byte W&B header, then LevelDB's log
    format (32 KiB blocks; each chunk a 7-byte header: crc32, length, type full/first/middle/last)."""
    import struct

    from wandb.proto import wandb_internal_pb2
    data, block, off, pending = path.read_bytes(), 32768, 7, b""
    while off + 7 <= len(data):
        if block - off % block < 7:  # a block's tail too short for a header is padding
            off += block - off % block
            continue
        _, length, kind = struct.unpack("<IHB", data[off:off + 7])
        chunk, off = data[off + 7:off + 7 + length], off + 7 + length
        if kind in (1, 4):  # full, last
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending + chunk)
            pending = b""
            yield record
        elif kind in (2, 3):  # first, middle
            pending += chunk


def finished_run_records(offline: Path, timeout_s: float = 30) -> list:
    """The run's records once its exit record is written: W&B's service process writes the file, and
    once in a loaded suite a read right after `finish` found no history (2026-12-07)."""
    path, deadline = next(offline.glob("run-*.wandb")), time.monotonic() + timeout_s
    while True:
        records = list(wandb_records(path))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def test_wandb_offline_gets_the_config_every_step_and_the_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_steps(tmp_path, "wandb")
    [offline] = (tmp_path / "wandb").glob("offline-run-*")
    records = finished_run_records(offline)
    def items(updates):
        return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in updates}
    history = [items(r.history.item) for r in records if r.WhichOneof("record_type") == "history"]
    rewards = [(h["_step"], h["reward/avg_raw_reward"]) for h in history if "reward/avg_raw_reward" in h]
    assert rewards == [(1, 0.5), (2, 0.75)], [r.WhichOneof("record_type") for r in records]
    assert not any("time" in h or any(k.startswith("samples/") for k in h) for h in history)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    config = items(run.config.update)
    assert config["trainer"]["run_name"] == "probe" and config["data"]["train_size"] == 8
    assert list((offline / "files").glob("media/images/learning_curve*.png"))


def test_a_logger_without_its_package_says_how_to_install_it(tmp_path, monkeypatch):
    import builtins
    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "wandb" else real(name, *a, **k))
    with pytest.raises(ImportError, match=r"trainer.logger=wandb needs its package: pip install 'visrl\[tracking\]'"):
        RunLog(str(tmp_path), logger="wandb", prometheus=False)
    assert os.path.isdir(tmp_path)


def test_several_trackers_at_once_and_a_resumed_run_continues_the_same_runs(tmp_path, monkeypatch):
    """trainer.logger as a list, as SkyRL and verl take it; a resumed run (its tracker ids from the
    checkpoint) logs into the same MLflow run and resumes the same W&B run, steps continuing."""
    from mlflow.tracking import MlflowClient
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    loggers = ["tensorboard", "mlflow", "wandb"]
    log = RunLog(str(tmp_path), logger=loggers, prometheus=False, project="visrl-test", run_name="probe", config=CONFIG)
    for step, metrics in STEPS:
        log.log(step, metrics)
    ids = log.tracker_ids()
    log.close()
    assert set(ids) == {"mlflow", "wandb"} and all(ids.values())
    assert list((tmp_path / "tensorboard").glob("events.*"))
    again = RunLog(str(tmp_path), keep_through_step=2, logger=loggers, prometheus=False, project="visrl-test",
                   run_name="probe", config=CONFIG, tracker_ids=ids)
    assert again.tracker_ids() == ids
    again.log(3, {"reward/avg_raw_reward": 1.0})
    again.close()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("visrl-test").experiment_id])
    history = client.get_metric_history(run.info.run_id, "reward/avg_raw_reward")
    assert run.info.run_id == ids["mlflow"] and [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.75), (3, 1.0)]
    runs = [r.run for d in (tmp_path / "wandb").glob("offline-run-*") for r in finished_run_records(d)
            if r.WhichOneof("record_type") == "run"]
    assert len(runs) == 2 and {r.run_id for r in runs} == {ids["wandb"]}


def test_a_checkpoint_keeps_the_tracker_ids(tmp_path):
    from rl.sampler import PromptSampler
    from rl.state import RunState
    rows = [{"seed": i} for i in range(4)]
    state = RunState(3, None, PromptSampler(rows, 2, 0), trackers={"mlflow": "abc", "wandb": "xyz"})
    snapshot = state.snapshot(10, "config")
    fresh = RunState(0, None, PromptSampler(rows, 2, 0))
    fresh.restore(snapshot, None)
    assert fresh.trackers == {"mlflow": "abc", "wandb": "xyz"} and fresh.step == 3
