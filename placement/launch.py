"""Start the long-lived actors where the plan puts them, named by role for the Ray Dashboard.

Actor classes are plain Python classes; `ray.remote` is applied here, at placement.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from placement.groups import create_groups, remove_groups
from placement.plan import Plan
from settings.schema import Config


@dataclass
class ActorSet:
    groups: dict
    env_pool: object
    engines: list
    policy: list
    ref: list
    checkpointer: object

    def all_handles(self) -> dict:
        named = {"EnvPool": self.env_pool}
        named.update({f"VLLMEngine-{i}": h for i, h in enumerate(self.engines)})
        named.update({f"FSDPPolicyShard-{i}": h for i, h in enumerate(self.policy)})
        named.update({f"RefShard-{i}": h for i, h in enumerate(self.ref)})
        named["Checkpointer"] = self.checkpointer
        return named


def slot_options(groups, pool, bundle_index, slot, namespace) -> dict:
    """Ray actor options that put an actor into its bundle of the plan."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    return {"name": slot.name, "namespace": namespace, "num_cpus": slot.num_cpus, "num_gpus": slot.num_gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=groups[pool.name], placement_group_bundle_index=bundle_index)}


def launch(cfg: Config, plan: Plan, model_path: str, total_steps: int) -> ActorSet:
    import ray

    from actors.env_pool import EnvPool
    from actors.policy_shard import FSDPPolicyShard
    from actors.ref_shard import RefShard
    from actors.vllm_engine import VLLMEngine, engine_settings
    from vlm.load import compute_dtype

    groups = create_groups(plan, cfg.trainer.placement.timeout_s)
    device = "cuda" if plan.use_gpu else "cpu"
    ns, t, g = cfg.ray.namespace, cfg.trainer, cfg.generator
    # Ray starts actors with OMP_NUM_THREADS=1; host-side work (preprocessing, sampling) wants the bundle's CPUs
    threads = max(1, int(t.placement.cpus_per_bundle))
    dtype = compute_dtype(device)
    policy, ref, engines, env_pool, checkpointer = [], [], [], None, None
    try:
        engines = [ray.remote(VLLMEngine).options(**slot_options(groups, pool, i, slot, ns)).remote(
            model_path, device=device, rank=slot.rank, dtype=dtype, threads=threads, **engine_settings(cfg))
            for pool, i, slot in plan.slots("engine")]
        if g.inference_engine.backend == "vllm" and plan.use_gpu:
            # vLLM sizes its KV cache from the GPU memory it sees free while it profiles: shards loading
            # onto the same GPU meanwhile would be counted against it, so they start once it is up
            ray.get([e.status.remote() for e in engines])
        policy = [ray.remote(FSDPPolicyShard).options(**slot_options(groups, pool, i, slot, ns)).remote(
            model_path, rank=slot.rank, world_size=len(plan.slots("policy")), device=device,
            lora=asdict(t.policy.model.lora), optimizer=asdict(t.policy.optimizer_config),
            total_steps=total_steps, seed=t.seed, cpu_offload=t.policy.fsdp_config.cpu_offload,
            s3_cfg=cfg.s3, threads=threads, dtype=dtype, gradient_checkpointing=t.gradient_checkpointing)
            for pool, i, slot in plan.slots("policy")]
        ref = [ray.remote(RefShard).options(**slot_options(groups, pool, i, slot, ns)).remote(
            model_path, rank=slot.rank, world_size=len(plan.slots("ref")), device=device,
            cpu_offload=t.ref.fsdp_config.cpu_offload, s3_cfg=cfg.s3, threads=threads, dtype=dtype)
            for pool, i, slot in plan.slots("ref")]
        env_pool = ray.remote(EnvPool).options(name="EnvPool", namespace=ns, num_cpus=0).remote(
            cfg.environment.env_class, cfg.environment.cell_px, g.max_turns)
        checkpointer = start_checkpointer(cfg)
        for shards in (policy, ref):
            if shards:
                addr, port = ray.get(shards[0].address.remote())
                ray.get([s.setup.remote(addr, port) for s in shards])
        ray.get([e.status.remote() for e in engines] + [env_pool.size.remote()])
    except Exception:
        # a half-started set must not keep its names, or the next attempt could not take them
        named = {s.name: h for role, handles in (("policy", policy), ("ref", ref), ("engine", engines))
                 for (_, _, s), h in zip(plan.slots(role), handles)}
        named |= {n: h for n, h in (("EnvPool", env_pool), ("Checkpointer", checkpointer)) if h is not None}
        release(named, ns)
        remove_groups(groups)
        raise
    return ActorSet(groups, env_pool, engines, policy, ref, checkpointer)


def start_checkpointer(cfg: Config):
    """The Checkpointer actor."""
    import ray

    from actors.checkpointer import Checkpointer
    return ray.remote(Checkpointer).options(name="Checkpointer", namespace=cfg.ray.namespace, num_cpus=0).remote(
        cfg.trainer.ckpt_path, cfg.s3, cfg.trainer.max_ckpts_to_keep)


def restart_checkpointer(cfg: Config, old, ready_timeout_s: float = 60.0):
    """Kill a Checkpointer stuck on a store that stopped answering; start a fresh one under its name
    and wait (bounded) until it is up, so that the next save's trainer.ckpt_timeout_s is spent on
    the store, not on the new actor's start (importing torch takes seconds on a busy machine)."""
    import ray
    from ray.exceptions import GetTimeoutError
    release({"Checkpointer": old}, cfg.ray.namespace)
    fresh = start_checkpointer(cfg)
    try:
        ray.get(fresh.__ray_ready__.remote(), timeout=ready_timeout_s)
    except GetTimeoutError:
        pass  # still starting: the next save waits for it within its own timeout
    return fresh


def release(named: dict, namespace: str, timeout_s: float = 30.0) -> None:
    """Kill actors ({name: handle}) and wait until Ray has freed their names for new actors."""
    import time

    import ray
    for handle in named.values():
        try:
            ray.kill(handle)
        except Exception:  # already dead
            pass
    deadline = time.monotonic() + timeout_s
    for name in named:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=namespace)
            except ValueError:  # the name is free
                break
            time.sleep(0.1)


def teardown(actors: ActorSet, namespace: str) -> None:
    release(actors.all_handles(), namespace)
    remove_groups(actors.groups)
