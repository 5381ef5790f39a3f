"""Resume and recovery through the real driver: a stopped-and-resumed run equals an uninterrupted
one; killed actors (SIGKILL and ray.kill) are rebuilt and the run finishes."""
import json

import pytest
from safetensors.torch import load_file

from tests.helpers import logged_steps, run_driver, signal_at_steps, tiny_run_args

pytestmark = pytest.mark.slow  # a system test: see setup.cfg's markers

VOLATILE = ("timing/", "time", "ckpt/", "sync/adapter_load_s", "generate/tokens_per_s", "generate/total_tokens_per_s",
            "generate/episodes_per_min", "recovery/", "memory/", "async/generate_s")
# one-step-off (controller/rollouts.py): the engines generate the next batch while the shards train
ONE_STEP_OFF = ["trainer.fully_async.enabled=true", "trainer.placement.colocate_all=false",
                "trainer.algorithm.use_tis=true", "trainer.algorithm.use_rollout_logprobs=false"]
SCHEDULES = pytest.mark.parametrize("schedule", [[], ONE_STEP_OFF], ids=["synchronous", "one-step-off"])


def tiny(model_dir, run):
    """The e2e run, four steps long, evaluated and checkpointed every second step (later keys win). The
    random tiny model never solves a maze: the penalty on turns that go nowhere gives its groups
    different scores, so every step changes the adapter."""
    return tiny_run_args(model_dir, run) + ["data.train_size=8", "trainer.hf_save_interval=100",
                                            "trainer.eval_interval=2", "trainer.ckpt_interval=2",
                                            "generator.sampling_params.temperature=1.5",
                                            "trainer.algorithm.gigpo.stay_penalty=0.5",
                                            "trainer.policy.optimizer_config.lr=0.01"]


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    """The tiny run from start to end under a schedule, run once for the tests that compare with it
    (checkpoints do not change what a run logs, so each test may save at its own interval)."""
    runs = {}

    def run_of(schedule):
        if tuple(schedule) not in runs:
            run = tmp_path_factory.mktemp("whole") / "run"
            assert run_driver(tiny(tiny_model_dir, run) + schedule).returncode == 0
            runs[tuple(schedule)] = run
        return runs[tuple(schedule)]
    return run_of


def stable(history):
    return [{k: v for k, v in h.items() if not k.startswith(VOLATILE)} for h in history]


def read(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def assert_same_history(whole, parts):
    """The run done in parts logged what the uninterrupted one did: steps 0-4, each once, the same numbers."""
    a, b = stable(read(whole)), stable(read(parts))
    assert [h["step"] for h in a] == [h["step"] for h in b] == [0, 1, 2, 3, 4]
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert abs(x[k] - y[k]) <= 1e-4 * max(1.0, abs(x[k])), (x["step"], k, x[k], y[k])


@SCHEDULES
def test_stopped_and_resumed_run_equals_an_uninterrupted_one(tiny_model_dir, tmp_path, uninterrupted, monkeypatch,
                                                           schedule):
    """...and its MLflow run continues: one run in the run folder's store, every step's numbers in it.
    One-step-off, the checkpoint records step 3's batch, sampled with adapter v1 (whose files it keeps),
    and the resume generates that batch again with it."""
    whole, parts = uninterrupted(schedule), tmp_path / "parts"
    trackers = ["trainer.logger=[tensorboard,mlflow]"]
    first = run_driver(tiny(tiny_model_dir, parts) + schedule + trackers + ["trainer.stop_after_step=2"])
    assert first.returncode == 0 and "stopping after step 2" in first.stderr + first.stdout
    second = run_driver(tiny(tiny_model_dir, parts) + schedule + trackers)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resumed from" in second.stdout and "at step 2" in second.stdout
    assert_same_history(whole, parts)
    assert all(h["policy/grad_norm"] > 0 for h in read(whole)[1:])  # every step trained
    saved = json.loads((parts / "ckpts" / "global_step_2" / "trainer_state.json").read_text())
    if schedule:
        assert [h["async/staleness"] for h in read(whole)[1:]] == [0, 1, 1, 1]
        assert all(h["policy/rollout_logprob_diff"] > 1e-3 for h in read(whole)[2:])  # the gap TIS corrects
        assert saved["rollouts_ahead"] == {"adapter_version": 1}
        assert (parts / "ckpts" / "global_step_2" / "rollout_policy" / "adapter_model.safetensors").is_file()
        assert "step 3's rollouts again with adapter v1" in second.stdout
    else:
        assert "rollouts_ahead" not in saved and "async/staleness" not in read(whole)[1]
    wa = load_file(str(whole / "ckpts" / "global_step_4" / "policy" / "adapter_model.safetensors"))
    wb = load_file(str(parts / "ckpts" / "global_step_4" / "policy" / "adapter_model.safetensors"))
    assert all((wa[k] - wb[k]).abs().max() < 1e-5 for k in wa)
    done = run_driver(tiny(tiny_model_dir, parts))
    assert done.returncode == 0 and "is complete" in done.stdout
    from mlflow.tracking import MlflowClient
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the run folder's store, as the tracker opened it
    client = MlflowClient(tracking_uri=(parts / "mlruns").resolve().as_uri())
    [run] = client.search_runs([e.experiment_id for e in client.search_experiments()])
    logged = [m.step for m in client.get_metric_history(run.info.run_id, "reward/avg_raw_reward")]
    assert logged == [1, 2, 3, 4]


def tensorboard_steps(run, tag="reward/avg_raw_reward"):
    """The steps TensorBoard shows for a tag (purged events dropped, as TensorBoard drops them)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


@SCHEDULES
def test_killed_actors_are_rebuilt_even_when_a_second_fault_hits_the_recovery(tiny_model_dir, tmp_path, schedule):
    """A random actor dies after steps 2 and 4, and the EnvPool dies again while the first recovery
    rebuilds: the second fault is one more restart, and every step is logged exactly once. One-step-off,
    the kills come while the next batch is being generated."""
    run = tmp_path / "chaos"
    out = run_driver(tiny(tiny_model_dir, run) + schedule + ["--chaos-kill-every", "2", "--chaos-method", "mixed",
                                                  "--chaos-in-recovery", "data.train_size=12",
                                                  "trainer.ckpt_interval=3", "trainer.max_restarts=4"])
    assert out.returncode == 0, out.stderr[-3000:]
    kills = [json.loads(line) for line in (run / "chaos.jsonl").read_text().splitlines()]
    assert [(k["after_step"], k["method"]) for k in kills] == [(2, "sigkill"), (None, "sigkill"), (4, "ray_kill")]
    assert kills[1]["actor"] == "EnvPool" and kills[1]["note"] == "during recovery"
    attempts = [json.loads(line) for line in (run / "recoveries.jsonl").read_text().splitlines()]
    assert [(r["restart"], r["attempt"], r["ok"]) for r in attempts] == [(1, 1, False), (2, 2, True), (3, 1, True)]
    assert "EnvPool" in attempts[0]["error"] or "died" in attempts[0]["error"].lower()
    assert attempts[0]["failed_step"] == attempts[1]["failed_step"] == 3  # every actor is used by step 3
    for r in (a for a in attempts if a["ok"]):  # back to the newest checkpoint (every 3rd step) before the failure
        assert r["resumed_from"] == max(s for s in (0, 3, 6) if s < r["failed_step"])
        assert r["steps_lost"] == r["failed_step"] - 1 - r["resumed_from"]
    assert [h["step"] for h in read(run)] == [0, 1, 2, 3, 4, 5, 6]  # no gap, no repeat
    assert tensorboard_steps(run) == [1, 2, 3, 4, 5, 6]
    assert "RECOVERY" in out.stdout


def test_a_killed_driver_and_a_corrupt_checkpoint_resume_without_repeating_a_step(tiny_model_dir, tmp_path):
    """SIGKILL of the driver after step 3 (checkpoint 2), rerun; then the newest checkpoint corrupted,
    rerun: each time every step is logged once, and steps up to the checkpoint keep the first run's values.
    Last, the driver stopped after step 4's save and before its line: the rerun takes the line from the
    checkpoint."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import ROOT
    run = tmp_path / "run"
    args = tiny(tiny_model_dir, run)
    proc = subprocess.Popen([sys.executable, "driver.py", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    deadline = time.monotonic() + 300
    while 3 not in logged_steps(run):
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before step 3"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = read(run)
    assert [h["step"] for h in first] == [0, 1, 2, 3] and (run / "ckpts" / "latest_ckpt_global_step.txt").read_text() == "2"

    again = run_driver(args)
    assert again.returncode == 0 and "at step 2" in again.stdout, again.stderr[-2000:]
    second = read(run)
    assert [h["step"] for h in second] == [0, 1, 2, 3, 4] and second[:3] == first[:3]
    assert tensorboard_steps(run) == [1, 2, 3, 4]

    blob = run / "ckpts" / "global_step_4" / "policy" / "adapter_model.safetensors"
    blob.write_bytes(blob.read_bytes()[:-3] + b"xyz")
    third = run_driver(args)
    assert third.returncode == 0 and "skipped global_step_4" in third.stdout and "at step 2" in third.stdout
    assert [h["step"] for h in read(run)] == [0, 1, 2, 3, 4] and read(run)[:3] == first[:3]
    assert tensorboard_steps(run) == [1, 2, 3, 4]

    logged = read(run)
    (run / "metrics.jsonl").write_text("".join(json.dumps(h) + "\n" for h in logged[:-1]))
    fourth = run_driver(args)
    assert fourth.returncode == 0 and "step 4's metrics line, lost" in fourth.stdout, fourth.stderr[-2000:]
    assert stable(read(run)) == stable(logged) and "reward/avg_raw_reward" in read(run)[-1]


def test_checkpoint_store_faults_are_bounded_retried_and_reported(tiny_model_dir, tmp_path):
    """The S3 store stops answering during step 2's save (SIGSTOP): the save gives up after
    trainer.ckpt_timeout_s and step 3 saves again once it is back. Then it refuses connections: the
    last save fails, is retried, and the run exits 3 naming the last durable checkpoint."""
    import os
    import signal
    import subprocess
    import sys

    from deploy.local_s3 import S3Server
    from tests.helpers import ROOT
    server = S3Server()
    try:
        server.client().create_bucket(Bucket="faults")
        run = tmp_path / "run"
        args = tiny(tiny_model_dir, run) + [
            "data.train_size=12", "trainer.eval_before_train=false", "trainer.eval_interval=100",
            "trainer.ckpt_path=s3://faults/run", f"s3.endpoint_url={server.url}", "s3.timeout_s=1",
            "s3.max_attempts=1", "trainer.ckpt_timeout_s=4"]
        proc = subprocess.Popen([sys.executable, "driver.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
        signal_at_steps(proc, run, server.proc.pid, [(1, signal.SIGSTOP), (2, signal.SIGCONT), (4, signal.SIGKILL)], 400)
        out, err = proc.communicate(timeout=300)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()
    assert proc.returncode == 3, err[-3000:]
    history = {h["step"]: h for h in read(run)}
    assert sorted(history) == [1, 2, 3, 4, 5, 6]
    assert history[2]["ckpt/failed"] == 1 and history[2]["timing/ckpt"] < 4 + 20  # bounded, not minutes
    assert history[3]["ckpt/failed"] == 0 and history[4]["ckpt/failed"] == 0, err[-3000:]  # retried at the next step
    assert history[6]["ckpt/failed"] == 1
    assert "last durable checkpoint is step 4" in err and "solve rate: baseline" not in out


@SCHEDULES
def test_sigterm_saves_the_state_exits_75_and_the_rerun_equals_an_uninterrupted_run(tiny_model_dir, tmp_path,
                                                                                     uninterrupted, schedule):
    """A spot reclaim or a pod deletion: SIGTERM to the driver mid-run. The step in flight is abandoned
    (before its update) or finished, the state is saved within trainer.preemption_timeout_s, the driver
    exits 75; the same command resumes, and the run is the uninterrupted one, each step logged once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from actors.checkpointer import Checkpointer
    from tests.helpers import ROOT
    whole, parts = uninterrupted(schedule), tmp_path / "parts"
    rare = ["trainer.ckpt_interval=100", "trainer.preemption_timeout_s=60"] + schedule  # no checkpoint but the last's
    args = tiny(tiny_model_dir, parts) + rare
    proc = subprocess.Popen([sys.executable, "driver.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    signal_at_steps(proc, parts, proc.pid, [(2, signal.SIGTERM)], timeout_s=600)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]
    assert time.monotonic() - sent < 60 and "preempted: the state of step" in out
    saved = Checkpointer(str(parts / "ckpts")).find_latest()[0]
    assert saved in (2, 3) and max(logged_steps(parts)) == saved  # the last finished step, nothing after it
    second = run_driver(args)
    assert second.returncode == 0, second.stderr[-2000:]
    assert f"at step {saved}" in second.stdout
    assert_same_history(whole, parts)
