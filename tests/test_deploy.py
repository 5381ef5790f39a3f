"""What deploy/ ships: the images' recipes and the KubeRay manifests. Images cannot be built here
(no Docker engine, no base-image registry), so what can be checked is: every file a recipe copies
exists, the versions it pins are the lock files', and the commands it and the manifests run work in
this environment. With KubeRay's CRDs at hand (deploy/kuberay/fetch_crds.sh), the manifests are also
validated against them."""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CRDS = Path(os.environ.get("VISRL_KUBERAY_CRDS", ROOT / "runs" / "kuberay-crds"))
IMAGES = {"cpu": "requirements/lock.txt", "gpu": "requirements/lock-gpu.txt", "serve": "requirements/lock-serve-gpu.txt"}
BASE_IMAGES = {"cpu": "rayproject/ray", "gpu": "rayproject/ray", "serve": "rayproject/ray-llm"}  # Ray's own images
MANIFEST_LOCKS = {"rayjob-train.yaml": "requirements/lock-gpu.txt", "rayservice-serve.yaml": "requirements/lock-serve-gpu.txt"}


def pins(lock: str) -> dict:
    return dict(line.split("==", 1) for line in (ROOT / lock).read_text().splitlines()
                if "==" in line and not line.startswith("#"))


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    return [tuple(line.split(None, 1)) for line in dockerfile.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("kind", sorted(IMAGES))
def test_image_recipe_copies_existing_files_and_pins_the_lock(kind):
    steps = instructions(ROOT / "deploy" / f"Dockerfile.{kind}")
    lock = pins(IMAGES[kind])
    base = next(arg for op, arg in steps if op == "FROM")
    assert base.startswith(f"{BASE_IMAGES[kind]}:{lock['ray']}-")  # the base's Ray is the tested one
    for op, arg in steps:
        if op == "COPY":
            *sources, _ = arg.split()
            for src in sources:
                assert (ROOT / src).exists(), f"Dockerfile.{kind} copies {src}, which does not exist"
        if op == "RUN" and "torch==" in arg:
            assert f"torch=={lock['torch'].split('+')[0]}" in arg  # the lock's torch, not another
    assert any(op == "RUN" and f"-c {IMAGES[kind]}" in arg for op, arg in steps)  # installed from the lock
    copied = {s.rstrip("/") for op, arg in steps if op == "COPY" for s in arg.split()[:-1]}
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages <= copied, packages - copied  # every package the wheel ships is in the image


@pytest.mark.parametrize("kind", ["cpu", "gpu"])  # the serving image's command is KubeRay's `ray start`
def test_image_command_runs_here(kind):
    cmd = next(arg for op, arg in instructions(ROOT / "deploy" / f"Dockerfile.{kind}") if op == "CMD")
    argv = yaml.safe_load(cmd)
    out = subprocess.run([sys.executable if argv[0] == "python" else argv[0], *argv[1:]], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "placement plan" in out.stdout


def manifest(name: str) -> dict:
    return yaml.safe_load((ROOT / "deploy" / "kuberay" / name).read_text())


def cluster_specs(doc: dict) -> dict:
    return doc["spec"].get("rayClusterSpec") or doc["spec"]["rayClusterConfig"]


@pytest.mark.parametrize("name", ["rayjob-train.yaml", "rayservice-serve.yaml"])
def test_manifests_run_the_tested_ray_with_a_cpu_head_and_gpu_workers(name):
    doc = manifest(name)
    assert doc["apiVersion"] == "ray.io/v1"
    spec = cluster_specs(doc)
    assert spec["rayVersion"] == pins(MANIFEST_LOCKS[name])["ray"]
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # the head runs the driver and the proxy, not actors
    head_res = head["template"]["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in head_res["limits"]
    for group in spec["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def pods(doc: dict) -> list[dict]:
    spec = cluster_specs(doc)
    return [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]


def fill(text: str, bucket: str = "my-bucket") -> str:
    return text.replace("<bucket>", bucket)


@pytest.mark.parametrize("name", ["rayjob-train.yaml", "rayservice-serve.yaml"])
def test_pods_use_the_service_account_the_shared_cache_and_mark_gpu_placement(name):
    """S3 through a service account (no static-key secret), HF_HOME on the shared claim (the base is
    downloaded once), GPU workers tolerate the GPU taint and pick a node type left as a placeholder."""
    doc = manifest(name)
    account = yaml.safe_load((ROOT / "deploy" / "kuberay" / "serviceaccount.yaml").read_text())
    assert account["kind"] == "ServiceAccount" and "role-arn" in next(iter(account["metadata"]["annotations"]))
    for pod in pods(doc):
        assert pod["serviceAccountName"] == account["metadata"]["name"]
        for container in pod["containers"]:
            assert "envFrom" not in container and "AWS_SECRET_ACCESS_KEY" not in json.dumps(container)
            env = {e["name"]: e["value"] for e in container.get("env", [])}
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert env["HF_HOME"].startswith("/shared/") and "/shared" in mounts
    for group in cluster_specs(doc)["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert all(re.fullmatch(r"<[\w-]+>", v) for v in pod["nodeSelector"].values())


def test_the_training_job_trains_then_publishes_with_values_from_its_config():
    """KubeRay runs the entrypoint from a submitter pod of its own: nothing in it may come from an
    environment variable. The config holds every value; with <bucket> left in it the driver stops."""
    from settings import ConfigError, load_config
    doc = manifest("rayjob-train.yaml")
    entry = doc["spec"]["entrypoint"]
    assert "$" not in entry
    train, publish = [shlex.split(part) for part in entry.split("&&")]
    assert train[:2] == ["python", "driver.py"] and (ROOT / train[1]).is_file()
    assert publish[:3] == ["python", "tools/publish.py", "maze-grpo"] and (ROOT / publish[1]).is_file()
    assert publish[3:] == train[2:]  # the same config: the run it trained
    config = ROOT / train[train.index("--config") + 1]
    with pytest.raises(ConfigError, match="placeholder <bucket>"):
        load_config(config, train[train.index("--config") + 2:])
    filled = [f"trainer.ckpt_path={fill('s3://<bucket>/ckpts')}"]
    cfg = load_config(config, filled)
    assert cfg.trainer.ckpt_path.startswith("s3://") and cfg.trainer.run_dir.startswith("/shared/")
    assert doc["spec"]["backoffLimit"] >= 1 and yaml.safe_load(doc["spec"]["runtimeEnvYAML"])["env_vars"]
    out = subprocess.run([sys.executable, "driver.py", "--dry-run", "--config", str(config), *filled], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "6 engines on 3 nodes" in out.stdout, out.stderr[-2000:]


def test_the_service_serves_through_ray_serve_llm_what_training_publishes():
    from serving.settings import ServeSettings
    doc = manifest("rayservice-serve.yaml")
    serve_config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert serve_config["http_options"]["host"] == "0.0.0.0"  # reachable through the service
    [app] = serve_config["applications"]
    module, attr = app["import_path"].split(":")
    assert (ROOT / f"{module}.py").is_file() and f"def {attr}(" in (ROOT / f"{module}.py").read_text()
    settings = ServeSettings.from_args(app["args"])
    assert settings.backend == "vllm" and settings.prewarm_names() == ["maze-grpo"]
    config = yaml.safe_load((ROOT / "configs" / "hyperpod_qwen3vl_8b.yaml").read_text())
    assert settings.dynamic_lora_loading_path == config["trainer"]["publish_path"]  # the same prefix
    assert settings.max_lora_rank >= config["trainer"]["policy"]["model"]["lora"]["rank"]
    assert settings.base_model == config["trainer"]["policy"]["model"]["path"]
    # the image's Ray is the one whose `llm` extra pins the vLLM that ran (requirements/lock-serve-gpu.txt)
    lock = pins(MANIFEST_LOCKS["rayservice-serve.yaml"])
    assert cluster_specs(doc)["rayVersion"] == lock["ray"] and lock["vllm"] == "0.26.0"


@pytest.mark.skipif(not CRDS.is_dir(), reason=f"KubeRay's CRDs are not at {CRDS} (deploy/kuberay/fetch_crds.sh)")
@pytest.mark.parametrize("name, crd", [("rayjob-train.yaml", "ray.io_rayjobs.yaml"),
                                       ("rayservice-serve.yaml", "ray.io_rayservices.yaml")])
def test_manifests_validate_against_kuberays_own_crds(name, crd):
    import jsonschema
    definition = yaml.safe_load((CRDS / crd).read_text())
    doc = manifest(name)
    version = next(v for v in definition["spec"]["versions"] if v["name"] == doc["apiVersion"].split("/")[1])
    schema = version["schema"]["openAPIV3Schema"]
    jsonschema.validate({k: v for k, v in doc.items() if k != "metadata"}, schema)
    broken = {**doc, "spec": {**doc["spec"], "backoffLimit": "two"}} if "backoffLimit" in doc["spec"] else \
        {**doc, "spec": {**doc["spec"], "rayClusterConfig": {**doc["spec"]["rayClusterConfig"], "rayVersion": 2}}}
    with pytest.raises(jsonschema.ValidationError):  # the schema does check what it is given
        jsonschema.validate({k: v for k, v in broken.items() if k != "metadata"}, schema)


def test_the_head_pod_gives_the_driver_time_to_save_on_sigterm():
    """A pod deletion sends SIGTERM, then SIGKILL after the grace period: the driver's bound on saving
    and exiting (trainer.preemption_timeout_s) must fit inside it."""
    from settings import load_config
    head = manifest("rayjob-train.yaml")["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    cfg = load_config(ROOT / "configs" / "hyperpod_qwen3vl_8b.yaml", ["trainer.ckpt_path=s3://b/c"])
    assert head["terminationGracePeriodSeconds"] > cfg.trainer.preemption_timeout_s
    # `ray job stop` (a suspended RayJob) gives the driver RAY_JOB_STOP_WAIT_TIME_S before SIGKILL, 3 s by default
    job = manifest("rayjob-train.yaml")["spec"]
    stop_wait = yaml.safe_load(job["runtimeEnvYAML"])["env_vars"]["RAY_JOB_STOP_WAIT_TIME_S"]
    assert float(stop_wait) > cfg.trainer.preemption_timeout_s


def test_a_worker_pod_asks_for_a_checkpoint_before_it_goes():
    """A worker pod deleted (a drain, a spot reclaim) runs its preStop hook before SIGTERM: the hook asks
    the driver for a checkpoint (controller/drain.py) and waits less than the pod's grace period."""
    for group in manifest("rayjob-train.yaml")["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        [container] = pod["containers"]
        command = container["lifecycle"]["preStop"]["exec"]["command"]
        assert command[:3] == ["python", "-m", "controller.drain"]
        timeout = float(command[command.index("--timeout") + 1])
        assert timeout < pod["terminationGracePeriodSeconds"]


def test_a_pod_monitor_scrapes_every_ray_pod_of_both_manifests_with_the_cluster_label():
    """The Prometheus Operator's PodMonitor: it selects the pods KubeRay labels as Ray nodes, scrapes
    the port every head and worker of both manifests names `metrics`, and copies the RayCluster's
    name into `ray_io_cluster`, the label the Grafana boards' `cluster` variable filters by."""
    monitor = manifest("podmonitor.yaml")
    assert monitor["kind"] == "PodMonitor" and monitor["spec"]["selector"]["matchLabels"] == {"ray.io/is-ray-node": "yes"}
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_ray_io_cluster"], "targetLabel": "ray_io_cluster"} \
        in endpoint["relabelings"]
    for name in ("rayjob-train.yaml", "rayservice-serve.yaml"):
        for pod in pods(manifest(name)):
            ports = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports", [])}
            assert ports.get(endpoint["port"]) == 8080, (name, ports)  # Ray's metrics export port
    for board in ("visrl-training.json", "visrl-serving.json"):
        variables = {v["name"]: v for v in json.loads((ROOT / "deploy" / "grafana" / board).read_text())["templating"]["list"]}
        assert "ray_io_cluster" in variables["cluster"]["query"]
