"""What the driver hands Ray when it connects: the run's namespace, the environment variables every
actor needs, and, when it joins a cluster outside a Ray Job, the code itself.

Actors on other nodes see only their node's environment and files. The driver passes on the
settings a model download and the store need (below), plus `ray.forward_env`; names are printed,
values never. Under `ray job submit` the job's own runtime environment ships the code (its
`--working-dir`) and its `env_vars`; the driver adds only variables the job does not set (Ray
refuses two values for one name). A driver that joins a running cluster itself (`ray.address` or
RAY_ADDRESS) ships this checkout as the working directory, so worker nodes need visrl's
dependencies, not its code.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from settings import Config

ROOT = Path(__file__).resolve().parent.parent

# Always passed when set: Hugging Face (token, caches, endpoint, offline mode), AWS/S3 (credentials,
# region, endpoint, CA bundle) and visrl's own cache.
FORWARDED_ENV = (
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HOME", "HF_HUB_CACHE", "HF_ENDPOINT", "HF_HUB_OFFLINE",
    "HF_HUB_DISABLE_XET", "TRANSFORMERS_OFFLINE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE",
    "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "VISRL_CACHE",
)
# Left out of the shipped checkout: run outputs, environments, packs for other machines.
SHIP_EXCLUDES = ["runs/", ".venv/", ".venv-vllm/", ".git/", "*.egg-info/", "__pycache__/", ".pytest_cache/",
                 ".hypothesis/", ".gpuwheels/", ".vllmgpu/", ".devpack/", ".devrun/", ".whl/"]


def job_runtime_env(environ=os.environ) -> dict | None:
    """The runtime environment `ray job submit` gave this driver, or None outside a Ray Job."""
    raw = environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR")
    return (json.loads(raw).get("runtime_env") or {}) if raw else None


def runtime_env(forward: list[str], address: str | None, environ=os.environ) -> dict:
    """ray.init's runtime_env for this driver (see the module docstring)."""
    job = job_runtime_env(environ)
    taken = set((job or {}).get("env_vars") or {})
    names = dict.fromkeys([*FORWARDED_ENV, *forward])
    env = {n: environ[n] for n in names if n in environ and n not in taken}
    out = {"env_vars": env} if env else {}
    joins = address is not None or "RAY_ADDRESS" in environ
    if job is None and joins:
        out |= {"working_dir": str(ROOT), "excludes": SHIP_EXCLUDES}
    return out


# The train pass allocates activations of a new size each micro-batch (packed to a token budget): with
# fixed segments the 8B shard's process held 68.9 GiB for 53.4 allocated; with segments that grow in
# place, 55.8 at the same step time (bench/record/2026-12-07-growable-allocator-segments-for-the-8b-step.md).
# vLLM's own engine is left alone: its sleep mode brings an allocator that refuses them.
ALLOCATOR_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
GROWABLE_SEGMENTS = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def allocator_options(role: str, backend: str, use_gpu: bool, passed: set[str]) -> dict:
    """Actor options giving a GPU actor that trains (policy, ref) or runs the hf engine growable
    allocator segments, unless the run passes its own allocator setting (`passed`: the variable
    names every actor already gets, ray.forward_env's and the Ray Job's)."""
    wants = use_gpu and (role in ("policy", "ref") or (role == "engine" and backend == "hf"))
    if not wants or passed & set(ALLOCATOR_ENV):
        return {}
    return {"runtime_env": {"env_vars": dict(GROWABLE_SEGMENTS)}}


def passed_env_names(forward: list[str], environ=os.environ) -> set[str]:
    """The environment variables every actor of this run gets: the job's and those the driver passes."""
    job = job_runtime_env(environ) or {}
    return set(job.get("env_vars") or {}) | set(runtime_env(forward, None, environ).get("env_vars", {}))


def run_namespace(configured: str | None, run_name: str) -> str:
    """The namespace of this run's named actors: the configured one, else one no other run has."""
    return configured or f"visrl-{run_name}-{uuid.uuid4().hex[:8]}"


def connect(cfg: Config) -> str:
    """ray.init for a run; sets cfg.ray.namespace to the namespace used and returns it."""
    import ray
    cfg.ray.namespace = run_namespace(cfg.ray.namespace, cfg.trainer.run_name)
    env = runtime_env(list(cfg.ray.forward_env), cfg.ray.address)
    ray.init(address=cfg.ray.address, namespace=cfg.ray.namespace, runtime_env=env or None,
             include_dashboard=cfg.ray.include_dashboard, configure_logging=False)
    shipped = "this checkout as the working directory, " if "working_dir" in env else ""
    passed = ", ".join(sorted(env.get("env_vars", {}))) or "none"
    print(f"ray: namespace {cfg.ray.namespace}; to every actor: {shipped}environment variables {passed}", flush=True)
    return cfg.ray.namespace
