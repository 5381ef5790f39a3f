"""Checkpoints: exact round trips, resume equals an uninterrupted run, crashes mid-save, S3."""
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from actors.checkpointer import MARKER, Checkpointer, CheckpointError, resume_step
from settings.schema import S3Config
from tests.helpers import fake_state
from tests.helpers import save_fake_checkpoint as save

ROOT = Path(__file__).resolve().parent.parent


def test_round_trip_is_bit_identical_and_prunes_keep_the_latest(tmp_path):
    ck = Checkpointer(str(tmp_path / "ckpts"), max_ckpts_to_keep=2)
    for step in (1, 2, 3):
        info = save(ck, step, tmp_path)
        assert info["bytes"] > 0
    assert ck.steps() == [2, 3] and ck.find_latest()[0] == 3
    assert (tmp_path / "ckpts" / MARKER).read_text() == "3"
    state = ck.load_policy_state(3, str(tmp_path / "restored"))
    want = fake_state(3)
    assert state["optimizer_steps"] == 3 and torch.equal(state["torch_rng"], want["torch_rng"])
    for k, v in want["optimizer"]["state"][0].items():
        assert torch.equal(state["optimizer"]["state"][0][k], v)
    assert state["scheduler"] == want["scheduler"]
    assert torch.equal(state["lora"]["base_model.model.x.lora_A.weight"], torch.full((2, 2), 3.0))
    assert ck.load_trainer_state(3)["sampler"]["cursor"] == 3


def test_corrupt_or_partial_checkpoints_are_skipped(tmp_path):
    ck = Checkpointer(str(tmp_path / "c"))
    save(ck, 1, tmp_path)
    save(ck, 2, tmp_path)
    blob = tmp_path / "c" / "global_step_2" / "policy" / "adapter_model.safetensors"
    blob.write_bytes(blob.read_bytes()[:-3] + b"xyz")
    step, notes = ck.find_latest()
    assert step == 1 and any("global_step_2" in n for n in notes)
    (tmp_path / "c" / "global_step_1" / "manifest.json").unlink()
    assert ck.find_latest()[0] is None
    with pytest.raises(CheckpointError, match="no checkpoint under .* verifies"):
        resume_step(ck, "c")  # checkpoints there, none loadable: an error, not a fresh start
    with pytest.raises(CheckpointError, match="cannot be loaded"):
        ck.load_trainer_state(2)


def test_a_first_save_cut_short_starts_over_but_a_committed_one_lost_is_an_error(tmp_path, capsys):
    """A job killed during its first checkpoint leaves a partial folder and no marker: resubmitted,
    it starts from step 0. Once a save was committed, nothing verifying is an error."""
    ck = Checkpointer(str(tmp_path / "c"))
    save(ck, 2, tmp_path)
    (tmp_path / "c" / "global_step_2" / "trainer_state.json").unlink()  # cut short before the manifest...
    (tmp_path / "c" / "global_step_2" / "manifest.json").unlink()
    (tmp_path / "c" / MARKER).unlink()  # ...and the marker
    assert resume_step(ck, "c") is None and "starting from step 0" in capsys.readouterr().out
    (tmp_path / "c" / MARKER).write_text("2")  # the same folder, but a save was committed: data lost
    with pytest.raises(CheckpointError, match="no checkpoint under .* verifies"):
        resume_step(ck, "c")


SAVER = """
import sys, json, time, torch
sys.path.insert(0, {root!r})
from tests.helpers import save_fake_checkpoint as save
from actors.checkpointer import Checkpointer
from pathlib import Path
ck = Checkpointer({path!r}, max_ckpts_to_keep=2)
step = (ck.find_latest()[0] or 0) + 1
print("ready", flush=True)
while True:
    save(ck, step, Path({tmp!r}))
    step += 1
"""


@pytest.mark.slow
def test_killing_the_saver_at_random_moments_always_leaves_a_loadable_latest(tmp_path):
    path = str(tmp_path / "ckpts")
    rng = np.random.default_rng(0)
    deadline = time.monotonic() + 45
    kills = 0
    while time.monotonic() < deadline and kills < 20:
        proc = subprocess.Popen([sys.executable, "-c", SAVER.format(root=str(ROOT), path=path, tmp=str(tmp_path))],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"  # imports done: from here on it only saves
        time.sleep(float(rng.uniform(0.1, 1.5)))  # a save takes milliseconds: any moment is mid-save or between
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        ck = Checkpointer(path)
        latest = ck.find_latest()[0]
        if latest is not None:
            assert ck.load_trainer_state(latest)["global_step"] == latest
            ck.load_policy_state(latest, str(tmp_path / "probe"))
    assert kills >= 5 and Checkpointer(path).find_latest()[0] is not None


def test_s3_save_prune_resume_and_a_server_outage_mid_upload(s3_server, tmp_path):
    s3_server.client().create_bucket(Bucket="ckpts")
    cfg = S3Config(endpoint_url=s3_server.url, max_attempts=1, timeout_s=2.0)
    ck = Checkpointer("s3://ckpts/run1", cfg, max_ckpts_to_keep=2)
    for step in (1, 2, 3):
        save(ck, step, tmp_path)
    assert ck.steps() == [2, 3] and ck.find_latest()[0] == 3
    assert ck.load_policy_state(3, str(tmp_path / "from_s3"))["optimizer_steps"] == 3
    # stop the server (SIGSTOP) as soon as step 4's first object lands, while the upload goes on
    client = s3_server.client()
    errors = []

    def upload():
        try:
            save(ck, 4, tmp_path)
        except CheckpointError as e:
            errors.append(e)

    t = threading.Thread(target=upload)
    t.start()
    for _ in range(400):
        listed = client.list_objects_v2(Bucket="ckpts", Prefix="run1/global_step_4/")
        if listed.get("KeyCount", 0):
            break
        time.sleep(0.005)
    os.kill(s3_server.proc.pid, signal.SIGSTOP)
    t.join(timeout=120)
    os.kill(s3_server.proc.pid, signal.SIGCONT)
    assert errors and "upload of global_step_4 to s3://ckpts/run1 failed" in str(errors[0])
    assert client.get_object(Bucket="ckpts", Key="run1/" + MARKER)["Body"].read() == b"3"
    assert Checkpointer("s3://ckpts/run1", cfg).find_latest()[0] == 3


@pytest.mark.parametrize("marker, note", [("", "empty"), ("ei\x00ght", "garbled"), ("9", "global_step_9, which does not exist")])
def test_the_marker_is_a_hint(tmp_path, marker, note, capsys):
    """An empty, garbled or dangling marker falls back to the newest checkpoint that verifies, and says so."""
    from actors.checkpointer import resume_step
    ck = Checkpointer(str(tmp_path / "c"))
    for step in (6, 8):
        save(ck, step, tmp_path)
    (tmp_path / "c" / MARKER).write_text(marker)
    step, notes = ck.find_latest()
    assert step == 8 and len(notes) == 1 and note in notes[0]
    assert resume_step(ck, "here") == 8 and note in capsys.readouterr().out
    blob = tmp_path / "c" / "global_step_8" / "trainer_state.json"
    blob.write_text(blob.read_text() + " ")
    assert ck.find_latest()[0] == 6  # 8 no longer verifies: the next older one does


def test_no_checkpoint_that_verifies_is_an_error_and_none_at_all_is_a_fresh_start(tmp_path):
    from actors.checkpointer import resume_step
    ck = Checkpointer(str(tmp_path / "c"))
    assert resume_step(ck, "here") is None  # nothing there: start from step 0
    save(ck, 2, tmp_path)
    (tmp_path / "c" / "global_step_2" / "manifest.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no checkpoint under here verifies.*resume_mode=none"):
        resume_step(ck, "here")


def test_the_checkpoint_interval_hint_follows_the_mttf_over_three_rule():
    """A failure every 6 hours calls for a checkpoint every 2 hours: 74 steps of 97 s."""
    from types import SimpleNamespace

    from controller.fleet import Fleet
    from settings import load_config
    fleet = Fleet.__new__(Fleet)
    fleet.cfg = load_config(None, ["trainer.hours_between_failures=6", "trainer.ckpt_interval=20"])
    hint = fleet.interval_hint(97.0)
    assert "every 120 min" in hint and "74 steps of 97.0 s" in hint and "trainer.ckpt_interval is 20" in hint
    assert Fleet.interval_hint(SimpleNamespace(cfg=load_config(None, [])), 97.0) is None


def test_one_step_off_state_round_trips_with_the_older_adapter_it_samples_with(tmp_path):
    """A checkpoint of one-step-off training records the batch in flight: the sampler's position before
    it was drawn and the adapter version it is sampled with, whose files it keeps (checksummed) when
    they are not the policy's; restoring gives the same record back."""
    from safetensors.torch import load_file

    from rl.sampler import PromptSampler
    from rl.state import RunState
    from storage.adapters import AdapterRef
    from tests.helpers import fake_adapter

    rows = [{"seed": i, "env_id": "maze_2d/easy"} for i in range(8)]
    state = RunState(3, AdapterRef(fake_adapter(tmp_path / "adapters" / "v3", 3), 3), PromptSampler(rows, 2, 0))
    state.sampler.next_batch()
    before = state.sampler.state_dict()
    state.sampler.next_batch()  # the batch of step 4, in flight
    state.ahead = {"adapter_version": 2, "sampler": before}
    snap = state.snapshot(4, "config")
    assert snap["sampler"] == before and snap["rollouts_ahead"] == {"adapter_version": 2} and state.rollout_version == 2
    ck = Checkpointer(str(tmp_path / "ckpts"))
    ck.save(3, snap, fake_state(3), state.adapter.path, fake_adapter(tmp_path / "adapters" / "v2", 2))
    ck.load_rollout_adapter(3, str(tmp_path / "restored-v2"))
    assert float(load_file(str(tmp_path / "restored-v2" / "adapter_model.safetensors"))
                 ["base_model.model.x.lora_A.weight"][0, 0]) == 2.0
    fresh = RunState(0, None, PromptSampler(rows, 2, 0))
    fresh.restore(ck.load_trainer_state(3), state.adapter)
    assert fresh.ahead == state.ahead and fresh.sampler.state_dict() == before
    fresh.reset()
    assert fresh.ahead is None and fresh.rollout_version == 0
    blob = tmp_path / "ckpts" / "global_step_3" / "rollout_policy" / "adapter_model.safetensors"
    blob.write_bytes(blob.read_bytes()[:-2] + b"xy")
    assert "rollout_policy/adapter_model.safetensors does not match" in ck.verify(3)


def test_adapter_versions_left_by_steps_a_recovery_went_back_on_are_pruned(tmp_path):
    """Back at step 1 after a recovery, v2 and v3 of the lost steps must not crowd out v1 (the version
    one-step-off samples the next batch with)."""
    from storage.adapters import prune_versions
    from tests.helpers import fake_adapter
    for v in (1, 2, 3):
        fake_adapter(tmp_path / f"v{v}", v)
    prune_versions(tmp_path, keep=2, current=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1"]
    for v in (2, 3, 4):
        fake_adapter(tmp_path / f"v{v}", v)
    prune_versions(tmp_path, keep=2, current=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v3", "v4"]
