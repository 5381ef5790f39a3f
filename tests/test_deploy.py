"""What deploy/ ships: the images' recipes and the KubeRay manifests. Images cannot be built here
(no Docker engine, no base-image registry), so what can be checked is: every file a recipe copies
exists, the versions it pins are the lock files', and the commands it and the manifests run work in
this environment. With KubeRay's CRDs at hand (deploy/kuberay/fetch_crds.sh), the manifests are also
validated against them."""
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
IMAGES = {"cpu": "requirements/lock.txt", "gpu": "requirements/lock-gpu.txt"}


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
    assert base.startswith(f"rayproject/ray:{lock['ray']}-")  # the base's Ray is the tested one
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


@pytest.mark.parametrize("kind", sorted(IMAGES))
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
    assert spec["rayVersion"] == pins("requirements/lock-gpu.txt")["ray"]
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # the head runs the driver and the proxy, not actors
    head_res = head["template"]["spec"]["containers"][0]["resources"]
    assert "nvidia.com/gpu" not in head_res["limits"]
    for group in spec["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def test_the_training_job_names_a_config_that_loads():
    from settings import load_config
    doc = manifest("rayjob-train.yaml")
    head = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in head["containers"][0]["env"]}
    argv = shlex.split(re.sub(r"\$(\w+)", lambda m: env[m.group(1)], doc["spec"]["entrypoint"]))
    assert argv[:2] == ["python", "driver.py"] and (ROOT / argv[1]).is_file()
    config, overrides = argv[argv.index("--config") + 1], argv[argv.index("--config") + 2:]
    cfg = load_config(ROOT / config, overrides)  # no placeholder left, every key known
    assert cfg.trainer.ckpt_path.startswith("s3://") and cfg.trainer.run_dir.startswith("/shared/")
    mounts = {m["mountPath"] for c in head["containers"] for m in c["volumeMounts"]}
    assert "/shared" in mounts  # run_dir and exports are on the shared claim
    assert doc["spec"]["backoffLimit"] >= 1 and yaml.safe_load(doc["spec"]["runtimeEnvYAML"])["env_vars"]
    out = subprocess.run([sys.executable, "driver.py", "--dry-run", "--config", config, *overrides], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "6 engines on 3 nodes" in out.stdout, out.stderr[-2000:]


def test_the_serve_app_takes_the_services_arguments():
    from serving.settings import ServeSettings
    doc = manifest("rayservice-serve.yaml")
    serve_config = yaml.safe_load(doc["spec"]["serveConfigV2"])
    assert serve_config["http_options"]["host"] == "0.0.0.0"  # reachable through the service
    [app] = serve_config["applications"]
    module, attr = app["import_path"].split(":")
    assert (ROOT / f"{module}.py").is_file() and f"def {attr}(" in (ROOT / f"{module}.py").read_text()
    settings = ServeSettings.from_args(app["args"])
    assert settings.backend == "hf" and settings.dynamic_lora_loading_path.startswith("s3://")
    assert settings.device == "cuda" and settings.num_gpus == 1  # one GPU a replica


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
