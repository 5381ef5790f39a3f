"""The run on a real multi-node Ray cluster on this machine: deploy/local_cluster.py starts it with
Ray's CLI (a head that offers actors no CPUs, and worker nodes, each its own raylet and object store,
with two `visrl_device` slots standing in for GPUs; none of them holds the shell's AWS or Hugging
Face variables). Jobs go through `ray job submit`; nodes are killed with SIGKILL and replaced by the
script's platform loop; checkpoints go to a real S3 server (moto's)."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.runtime_env import FORWARDED_ENV, SHIP_EXCLUDES, runtime_env
from deploy.local_cluster import LocalCluster

pytestmark = pytest.mark.slow  # a system test: see setup.cfg's markers

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).parent / "ray")
# a few small steps: 4 mazes of 4 samples a step, no eval between the first and the last
SMALL = ["trainer.train_batch_size=4", "trainer.policy_mini_batch_size=4", "generator.n_samples_per_prompt=4",
         "data.eval_size=4", "trainer.eval_interval=100", "trainer.hf_save_interval=100"]
# the policy (and its colocated engine) on two nodes, one device slot each
TWO_NODES = ["trainer.placement.policy_num_nodes=2", "trainer.placement.ref_num_nodes=2",
             "generator.inference_engine.num_engines=2", "trainer.placement.device_resource=visrl_device",
             "trainer.placement.cpus_per_bundle=1"]


def run_args(run: Path) -> list[str]:
    return [f"trainer.run_dir={run}", f"trainer.ckpt_path={run}/ckpts", f"trainer.export_path={run}/exports",
            f"data.dataset_dir={run}/data"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("cluster"))
    c.up(workers=2, cpus=2, devices=2)
    yield c
    c.down()


def copy_repo(dest: Path) -> Path:
    """The checkout a user submits from: a copy, so that nothing can come from this one."""
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(*[e.rstrip("/") for e in SHIP_EXCLUDES], "tmp*"))
    return dest


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory):
    return copy_repo(tmp_path_factory.mktemp("submit") / "visrl")


def submit(cluster, workdir: Path, args: list[str], env_vars: dict | None = None) -> str:
    cmd = [RAY, "job", "submit", "--address", cluster.dashboard, "--no-wait", "--working-dir", str(workdir)]
    if env_vars:
        cmd += ["--runtime-env-json", json.dumps({"env_vars": env_vars})]
    out = subprocess.run(cmd + ["--", "python", "driver.py", *args], capture_output=True, text=True, timeout=120,
                         env=cluster.env())
    found = re.search(r"Job '(raysubmit_\w+)' submitted successfully", out.stdout + out.stderr)
    assert found, out.stdout[-2000:] + out.stderr[-2000:]
    return found.group(1)


def wait_job(cluster, job: str, timeout_s: float = 900) -> str:
    from ray.job_submission import JobSubmissionClient
    client = JobSubmissionClient(cluster.dashboard)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = str(client.get_job_status(job)).rsplit(".", 1)[-1]
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            return status
        time.sleep(2)
    raise AssertionError(f"job {job} still running after {timeout_s}s:\n{job_logs(cluster, job)[-3000:]}")


def job_logs(cluster, job: str) -> str:
    """`ray job logs`, as a user reads them."""
    return subprocess.run([RAY, "job", "logs", "--address", cluster.dashboard, job], capture_output=True, text=True,
                          timeout=60, env=cluster.env()).stdout


def history(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def test_forwarded_variables_and_shipped_code():
    """What reaches the actors: the Hugging Face and AWS settings of the driver (never twice: a Ray
    Job's own env_vars win), `ray.forward_env`; this checkout only when joining a cluster outside a job."""
    env = {"HF_TOKEN": "h", "AWS_SECRET_ACCESS_KEY": "s", "MY_SETTING": "m", "UNRELATED": "u"}
    local = runtime_env(["MY_SETTING"], None, env)
    assert local == {"env_vars": {"HF_TOKEN": "h", "AWS_SECRET_ACCESS_KEY": "s", "MY_SETTING": "m"}}
    joined = runtime_env([], "127.0.0.1:6379", env)
    assert joined["working_dir"] == str(ROOT) and "runs/" in joined["excludes"]
    job = {**env, "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"env_vars": {"HF_TOKEN": "job"},
                                                                              "working_dir": "gcs://x.zip"}})}
    assert runtime_env([], "auto", job) == {"env_vars": {"AWS_SECRET_ACCESS_KEY": "s"}}
    assert set(FORWARDED_ENV) >= {"HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_ENDPOINT_URL", "HF_HOME"}


def test_two_jobs_at_once_place_the_policy_on_two_nodes_and_succeed(cluster, repo_copy, tmp_path):
    """Two runs submitted at once from one checkout (so one working-directory package for both)."""
    from ray.util.state import list_actors
    runs = [tmp_path / "a", tmp_path / "b"]
    jobs = [submit(cluster, repo_copy, run_args(run) + SMALL + TWO_NODES + ["data.train_size=8"]) for run in runs]
    for job in jobs:
        assert wait_job(cluster, job) == "SUCCEEDED", job_logs(cluster, job)[-3000:]
    logs = job_logs(cluster, jobs[0])
    assert "solve rate: baseline" in logs and "step 2/2" in logs
    head = cluster.head_node_id()
    workers = {n["node_id"] for n in cluster.nodes() if n["alive"] and not n["is_head"]}
    placements = [json.loads((run / "placement.json").read_text()) for run in runs]
    assert placements[0]["namespace"] != placements[1]["namespace"]  # a namespace a run: no name clashes
    for p in placements:
        # Ray's state API, independently of what the driver wrote
        seen = {a.name: a.node_id for a in list_actors(address=cluster.dashboard, limit=1000,
                                                       filters=[("ray_namespace", "=", p["namespace"])]) if a.name}
        assert seen == p["actors"]
        shard0, shard1 = p["actors"]["FSDPPolicyShard-0"], p["actors"]["FSDPPolicyShard-1"]
        assert shard0 != shard1 and {shard0, shard1} <= workers  # the policy spread over two worker nodes
        assert p["actors"]["VLLMEngine-0"] == shard0 and p["actors"]["VLLMEngine-1"] == shard1  # colocated
        assert p["actors"]["EnvPool"] == p["actors"]["Checkpointer"] == p["driver_node"] == head
        # the code came with the job (its working directory), not from this checkout
        assert all("runtime_resources" in root and not root.startswith(str(ROOT)) for root in p["code"].values())
        # one unpacked copy a node, none shared between nodes: a node unpacking the package over
        # another node's copy would pull the working directory from under that node's workers
        roots = {(node, p["code"][actor]) for actor, node in p["actors"].items()}
        assert len(roots) == len({node for node, _ in roots}) == len({root for _, root in roots})


def test_a_failing_job_ends_failed_with_the_reason(cluster, repo_copy, tmp_path):
    job = submit(cluster, repo_copy, run_args(tmp_path / "bad") + ["trainer.epochz=1"])
    assert wait_job(cluster, job, timeout_s=300) == "FAILED"
    from ray.job_submission import JobSubmissionClient
    assert "exit code 2" in JobSubmissionClient(cluster.dashboard).get_job_info(job).message
    assert "unknown config key 'trainer.epochz'; did you mean 'trainer.epochs'?" in job_logs(cluster, job)


@pytest.mark.parametrize("fsdp_size", [-1, 1])
def test_two_shards_on_two_nodes_train_like_one(cluster, tiny_model_dir, tmp_path, fsdp_size):
    """tests/test_fsdp.py's equality, with the two ranks on two nodes (gloo across raylets), the base
    sharded over both (-1) or whole on each with only the LoRA gradients crossing (1; with one shard a
    node this is also the hybrid design)."""
    import pickle

    from safetensors.torch import load_file

    from tests.helpers import make_items, train_with
    batch = make_items(tiny_model_dir)
    one, lora_one = train_with(1, tiny_model_dir, tmp_path, batch)
    (tmp_path / "items.pkl").write_bytes(pickle.dumps(batch))
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "cluster_shards.py"), cluster.address, tiny_model_dir,
                          str(tmp_path / "items.pkl"), str(tmp_path / "two"), str(fsdp_size)], capture_output=True, text=True,
                         timeout=600, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert out.returncode == 0, out.stderr[-3000:]
    two = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(set(two["nodes"])) == 2 and cluster.head_node_id() not in two["nodes"]
    for key in ("policy_loss", "policy_kl", "grad_norm", "entropy"):
        assert abs(one["metrics"][key] - two["metrics"][key]) < 1e-4 * max(1, abs(one["metrics"][key])), key
    crossed = {k for k, v in two["metrics"].items() if k.endswith("_bytes") and v > 0 and k != "comm/total_bytes"}
    if fsdp_size == -1:  # the base gathered over both nodes
        assert "comm/world/all_gather_bytes" in crossed, two["metrics"]
    else:  # the base never moves: only the LoRA gradients (and the step's few statistics)
        assert not any("all_gather" in k for k in crossed) and "comm/replicate/all_reduce_bytes" in crossed, crossed
    lora_two = load_file(str(tmp_path / "two" / "adapter" / "adapter_model.safetensors"))
    assert lora_one.keys() == lora_two.keys()
    import torch
    for k in lora_one:
        torch.testing.assert_close(lora_one[k], lora_two[k], atol=2e-5, rtol=1e-4)


@pytest.fixture
def platform(cluster):
    """The platform's node replacement: a lost worker is replaced 2 s after Ray declares it dead."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "deploy" / "local_cluster.py"), "--dir", str(cluster.dir),
                             "platform", "--replace-after", "2", "--cpus", "2", "--devices", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield proc
    proc.terminate()
    proc.wait(timeout=30)


def test_lost_nodes_are_replaced_and_the_run_finishes(cluster, platform, s3_server, tmp_path):
    """A worker node killed mid-generate, mid-train (with SIGTERM, as a pod deletion sends it), during
    a checkpoint save, and drained (its preStop hook asks for a checkpoint, then SIGTERM): each time the
    driver waits for the replacement, rebuilds the lost actors and restores the last checkpoint from S3;
    the drained node costs no step."""
    from actors.checkpointer import Checkpointer
    from settings.schema import S3Config
    s3_server.client().create_bucket(Bucket="node-loss")
    run = tmp_path / "run"
    args = run_args(run) + SMALL + TWO_NODES + [
        "data.train_size=24", "trainer.ckpt_interval=2", "trainer.ckpt_path=s3://node-loss/ckpts",
        "trainer.export_path=s3://node-loss/exports", f"s3.endpoint_url={s3_server.url}",
        "trainer.placement.recovery_timeout_s=300"]
    kills = ["--chaos-kill-node", "generate@2", "--chaos-kill-node", "train@3:sigterm", "--chaos-kill-node", "ckpt@4",
             "--chaos-kill-node", "train@5:drain"]
    # the driver's own environment holds the S3 credentials (conftest); the nodes do not: they reach
    # the Checkpointer only by the driver passing them on
    out = subprocess.run([sys.executable, "driver.py", *kills, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=1500, env=cluster.env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "solve rate: baseline" in out.stdout
    assert [h["step"] for h in history(run)] == list(range(7))  # every step exactly once
    chaos = [json.loads(line) for line in (run / "chaos.jsonl").read_text().splitlines()]
    assert [(c["phase"], c["step"], c["signal"]) for c in chaos] == [("generate", 2, "sigkill"), ("train", 3, "sigterm"),
                                                                     ("ckpt", 4, "sigkill"), ("train", 5, "drain")]
    attempts = [json.loads(line) for line in (run / "recoveries.jsonl").read_text().splitlines()]
    # one successful rebuild a kill; an attempt that fails (on a loaded machine a rebuilt actor can die
    # again before the restore ends) is recorded with its error and retried
    recovered = [r for r in attempts if r["ok"]]
    assert len(recovered) == 4 and all(r["error"] for r in attempts if not r["ok"]), attempts
    assert all(r["steps_lost"] <= 2 for r in recovered)  # at most one checkpoint interval
    # resumed from nothing, then from step 2; the save of step 4 was cut off (or had just committed);
    # the drain came during step 5's update: the step finished and saved out of turn (the interval is 2)
    resumed = [r["resumed_from"] for r in recovered]
    assert resumed[:3] == [0, 2, 2] or resumed[:3] == [0, 2, 4], recovered
    assert resumed[3] == 5 and recovered[3]["steps_lost"] == 0, recovered
    back = [r["back_to_step_s"] for r in recovered]  # from the groups placed again to the next step's end
    assert max(back) < 120
    dead = {n["node_id"] for n in cluster.nodes() if not n["alive"]}
    assert {c["node"] for c in chaos} <= dead
    store = Checkpointer("s3://node-loss/ckpts", S3Config(endpoint_url=s3_server.url))
    assert store.steps() == [5, 6] and all(store.verify(s) is None for s in store.steps())  # 2 kept (default.yaml)
    assert store.find_latest() == (6, [])


def test_one_step_off_on_nodes_of_their_own_survives_losing_the_shards_node(cluster, platform, tmp_path):
    """Separate pools on separate nodes (the two policy shards fill one node's device slots, the two
    engines the other's), one-step-off: the engines generate the next batch while the shards train.
    The shards' node is killed mid-update: the run rebuilds on the replacement, restores step 2's
    checkpoint, generates again the batch in flight it records (with the adapter it names), and logs
    every step once, one adapter version behind throughout."""
    run = tmp_path / "run"
    args = run_args(run) + SMALL + [
        "trainer.placement.colocate_all=false", "trainer.placement.policy_num_gpus_per_node=2",
        "trainer.placement.ref_num_gpus_per_node=2", "generator.inference_engine.num_engines=2",
        "trainer.placement.device_resource=visrl_device", "trainer.placement.cpus_per_bundle=1",
        "trainer.fully_async.enabled=true", "trainer.algorithm.use_tis=true",
        "trainer.algorithm.use_rollout_logprobs=false", "data.train_size=20", "trainer.ckpt_interval=2",
        "trainer.placement.recovery_timeout_s=300"]
    out = subprocess.run([sys.executable, "driver.py", "--chaos-kill-node", "train@3", *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=1200, env=cluster.env())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    steps = history(run)
    assert [h["step"] for h in steps] == list(range(6))  # every step exactly once
    assert [h["async/staleness"] for h in steps[1:]] == [0, 1, 1, 1, 1]
    [recovered] = [json.loads(line) for line in (run / "recoveries.jsonl").read_text().splitlines()
                   if json.loads(line)["ok"]]
    assert recovered["failed_step"] == 3 and recovered["resumed_from"] == 2 and recovered["steps_lost"] == 0
    assert "step 3's rollouts again with adapter v1" in out.stdout
    placed = json.loads((run / "placement.json").read_text())["actors"]  # as placed after the rebuild
    shards = {placed["FSDPPolicyShard-0"], placed["FSDPPolicyShard-1"]}
    engines = {placed["VLLMEngine-0"], placed["VLLMEngine-1"]}
    assert len(shards) == len(engines) == 1 and not shards & engines


def test_a_stopped_job_saves_its_state_and_the_job_resubmitted_resumes(cluster, repo_copy, tmp_path):
    """`ray job stop` sends the driver SIGTERM, as a RayJob's deletion or a preemption does. Given
    time (the job's RAY_JOB_STOP_WAIT_TIME_S above trainer.preemption_timeout_s; Ray's default is 3 s
    before SIGKILL), the driver saves and exits; the same job submitted again resumes there, each
    step logged once."""
    from actors.checkpointer import Checkpointer
    run = tmp_path / "run"
    args = run_args(run) + SMALL + TWO_NODES + ["data.train_size=24", "trainer.ckpt_interval=100",
                                                "trainer.preemption_timeout_s=60"]
    grace = {"RAY_JOB_STOP_WAIT_TIME_S": "90"}
    job = submit(cluster, repo_copy, args, env_vars=grace)
    deadline = time.monotonic() + 600
    while not ((run / "metrics.jsonl").exists() and len(history(run)) >= 3) and time.monotonic() < deadline:
        time.sleep(1)
    assert len(history(run)) >= 3, job_logs(cluster, job)[-3000:]  # steps 0 (the first eval), 1 and 2
    subprocess.run([RAY, "job", "stop", "--address", cluster.dashboard, job], capture_output=True, text=True,
                   timeout=180, env=cluster.env())
    assert wait_job(cluster, job, timeout_s=180) == "STOPPED"
    logs = job_logs(cluster, job)
    saved = re.search(r"preempted: the state of step (\d+) is saved", logs)
    assert saved, logs[-3000:]
    saved = int(saved.group(1))
    assert Checkpointer(str(run / "ckpts")).find_latest()[0] == saved >= 2
    job = submit(cluster, repo_copy, args, env_vars=grace)
    assert wait_job(cluster, job) == "SUCCEEDED", job_logs(cluster, job)[-3000:]
    assert f"at step {saved}" in job_logs(cluster, job)
    assert [h["step"] for h in history(run)] == list(range(7))


def test_the_whole_cluster_gone_and_the_job_resubmitted_resumes(cluster, repo_copy, s3_server, tmp_path):
    """Every node stopped mid-run (the job's driver with them); a new cluster; the same job again."""
    from actors.checkpointer import Checkpointer
    from settings.schema import S3Config
    s3_server.client().create_bucket(Bucket="whole")
    run = tmp_path / "run"
    args = run_args(run) + SMALL + TWO_NODES + [
        "data.train_size=24", "trainer.ckpt_interval=2", "trainer.ckpt_path=s3://whole/ckpts",
        f"s3.endpoint_url={s3_server.url}"]
    creds = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    job = submit(cluster, repo_copy, args, env_vars=creds)
    store = Checkpointer("s3://whole/ckpts", S3Config(endpoint_url=s3_server.url))
    deadline = time.monotonic() + 600
    while not store.ever_committed() and time.monotonic() < deadline:  # a whole checkpoint, not one being uploaded
        time.sleep(1)
    assert store.ever_committed(), job_logs(cluster, job)[-3000:]
    cluster.down()
    cluster.up(workers=2, cpus=2, devices=2)
    job = submit(cluster, repo_copy, args, env_vars=creds)
    assert wait_job(cluster, job) == "SUCCEEDED", job_logs(cluster, job)[-3000:]
    logs = job_logs(cluster, job)
    resumed = re.search(r"resumed from s3://whole/ckpts at step (\d+)", logs)
    assert resumed and int(resumed.group(1)) >= 2, logs[-3000:]
    assert [h["step"] for h in history(run)] == list(range(7))
    assert store.find_latest() == (6, [])
