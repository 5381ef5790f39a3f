"""GPU actors that train, and the hf engine, get growable allocator segments through their Ray
runtime environment (controller/runtime_env.py, set by controller/launch.py), beside what the run
forwards to every actor; a setting the run passes itself wins. Checked through a real local Ray: the
actor's own environment is what its CUDA allocator reads when it starts. That the segments grow on a
GPU: tests/on_gpu/test_policy_offload.py."""
import os

import pytest

from controller.runtime_env import GROWABLE_SEGMENTS, allocator_options, connect, passed_env_names
from settings import load_config

VAR = "PYTORCH_CUDA_ALLOC_CONF"


@pytest.mark.parametrize("users", [None, "garbage_collection_threshold:0.8"])
def test_gpu_actors_grow_their_segments_unless_the_run_sets_the_allocator(monkeypatch, users):
    import ray

    class EnvReader:  # defined here, so Ray ships it by value to the worker
        def read(self, names):
            return {n: os.environ.get(n) for n in names}

    monkeypatch.setenv("MY_SETTING", "kept")
    forward = ["MY_SETTING", VAR] if users else ["MY_SETTING"]
    if users:
        monkeypatch.setenv(VAR, users)
    else:
        monkeypatch.delenv(VAR, raising=False)
    cfg = load_config(None, [f"ray.forward_env=[{','.join(forward)}]", "ray.include_dashboard=false"])
    connect(cfg)
    try:
        passed = passed_env_names(forward)
        reader = ray.remote(EnvReader).options(num_cpus=0, **allocator_options("policy", "hf", True, passed)).remote()
        seen = ray.get(reader.read.remote(["MY_SETTING", VAR]))
    finally:
        ray.shutdown()
    # the actor's variables add to the run's: the forwarded one is still there
    assert seen == {"MY_SETTING": "kept", VAR: users or GROWABLE_SEGMENTS[VAR]}


def test_only_gpu_trainers_and_the_hf_engine_get_growable_segments():
    growable = {"runtime_env": {"env_vars": GROWABLE_SEGMENTS}}
    assert allocator_options("policy", "vllm", True, set()) == growable
    assert allocator_options("ref", "hf", True, set()) == growable
    assert allocator_options("engine", "hf", True, set()) == growable
    # vLLM's sleep mode brings its own allocator, which refuses expandable segments
    assert allocator_options("engine", "vllm", True, set()) == {}
    assert allocator_options("policy", "hf", False, set()) == {}  # nothing to set on CPUs
    assert allocator_options("policy", "hf", True, {"PYTORCH_ALLOC_CONF"}) == {}  # the run's own setting
