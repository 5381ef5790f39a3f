"""Start the long-lived actors where the plan puts them, named by role for the Ray Dashboard.

Actor classes are plain Python classes; `ray.remote` is applied here, at placement.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from controller.runtime_env import allocator_options, passed_env_names
from placement.groups import bundle_nodes, create_groups, remove_groups
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
    nodes: dict  # actor name -> the node id Ray placed it on
    placement_s: float  # how long the placement groups took to be placed
    placed_at: float    # when they were (time.time())

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


def on_driver_node() -> dict:
    """Actor options that keep an actor on the driver's node (the head): EnvPool and Checkpointer,
    which reserve no resources, so the head can offer none to the groups."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)}


def launch(cfg: Config, plan: Plan, model_path: str, total_steps: int, timeout_s: float | None = None,
           waiting=None) -> ActorSet:
    """Place and start every actor of the plan; the groups wait up to `timeout_s` (default
    trainer.placement.timeout_s), telling `waiting` what is missing meanwhile."""
    import ray

    from actors.env_pool import EnvPool
    from actors.policy_shard import FSDPPolicyShard
    from actors.ref_shard import RefShard
    from actors.vllm_engine import VLLMEngine, engine_settings
    from vlm.load import compute_dtype

    started = time.perf_counter()
    groups = create_groups(plan, timeout_s or cfg.trainer.placement.timeout_s, waiting)
    placement_s, placed_at = time.perf_counter() - started, time.time()
    device = "cuda" if plan.use_gpu else "cpu"
    ns, t, g = cfg.ray.namespace, cfg.trainer, cfg.generator
    # Ray starts actors with OMP_NUM_THREADS=1; host-side work (preprocessing, sampling) wants the bundle's CPUs
    threads = max(1, int(t.placement.cpus_per_bundle))
    dtype = compute_dtype(device)
    passed = passed_env_names(list(cfg.ray.forward_env))
    allocator = {role: allocator_options(role, g.inference_engine.backend, plan.use_gpu, passed)
                 for role in ("engine", "policy", "ref")}
    policy, ref, engines, env_pool, checkpointer = [], [], [], None, None
    try:
        # one-step-off: an engine generating for minutes still answers status, memory and liveness calls
        concurrency = {"max_concurrency": 2} if t.fully_async.enabled else {}
        engines = [ray.remote(VLLMEngine).options(**slot_options(groups, pool, i, slot, ns), **concurrency,
                                                 **allocator["engine"]).remote(
            model_path, device=device, rank=slot.rank, dtype=dtype, threads=threads, **engine_settings(cfg))
            for pool, i, slot in plan.slots("engine")]
        if g.inference_engine.backend == "vllm" and plan.use_gpu:
            # vLLM sizes its KV cache from the GPU memory it sees free while it profiles: shards loading
            # onto the same GPU meanwhile would be counted against it, so they start once it is up
            ray.get([e.status.remote() for e in engines])
        policy = [ray.remote(FSDPPolicyShard).options(**slot_options(groups, pool, i, slot, ns), **allocator["policy"]).remote(
            model_path, rank=slot.rank, world_size=len(plan.slots("policy")), device=device,
            lora=asdict(t.policy.model.lora), optimizer=asdict(t.policy.optimizer_config),
            total_steps=total_steps, seed=t.seed, cpu_offload=t.policy.fsdp_config.cpu_offload,
            s3_cfg=cfg.s3, threads=threads, dtype=dtype, gradient_checkpointing=t.gradient_checkpointing,
            speedups=t.policy.model.speedups, fsdp_size=t.policy.fsdp_config.fsdp_size,
            record_collectives=t.policy.fsdp_config.record_collectives, compile_layers=t.policy.model.compile_layers,
            max_tokens_per_micro_batch=t.max_tokens_per_micro_batch)
            for pool, i, slot in plan.slots("policy")]
        ref = [ray.remote(RefShard).options(**slot_options(groups, pool, i, slot, ns), **allocator["ref"]).remote(
            model_path, rank=slot.rank, world_size=len(plan.slots("ref")), device=device,
            cpu_offload=t.ref.fsdp_config.cpu_offload, s3_cfg=cfg.s3, threads=threads, dtype=dtype,
            speedups=t.policy.model.speedups, fsdp_size=t.ref.fsdp_config.fsdp_size,
            max_tokens_per_micro_batch=t.max_tokens_per_micro_batch)
            for pool, i, slot in plan.slots("ref")]
        env_pool = ray.remote(EnvPool).options(name="EnvPool", namespace=ns, **on_driver_node()).remote(
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
        release(named)
        remove_groups(groups)
        raise
    placed = bundle_nodes(groups)
    head = ray.get_runtime_context().get_node_id()
    nodes = {slot.name: placed[(pool.name, i)] for role in ("policy", "ref", "engine")
             for pool, i, slot in plan.slots(role)} | {"EnvPool": head, "Checkpointer": head}
    return ActorSet(groups, env_pool, engines, policy, ref, checkpointer, nodes, placement_s, placed_at)


def start_checkpointer(cfg: Config):
    """The Checkpointer actor."""
    import ray

    from actors.checkpointer import Checkpointer
    return ray.remote(Checkpointer).options(name="Checkpointer", namespace=cfg.ray.namespace, **on_driver_node()).remote(
        cfg.trainer.ckpt_path, cfg.s3, cfg.trainer.max_ckpts_to_keep)


def restart_checkpointer(cfg: Config, old, ready_timeout_s: float = 60.0):
    """Kill a Checkpointer stuck on a store that stopped answering; start a fresh one under its name
    and wait (bounded) until it is up, so that the next save's trainer.ckpt_timeout_s is spent on
    the store, not on the new actor's start (importing torch takes seconds on a busy machine)."""
    import ray
    from ray.exceptions import GetTimeoutError
    release({"Checkpointer": old})
    fresh = start_checkpointer(cfg)
    try:
        ray.get(fresh.__ray_ready__.remote(), timeout=ready_timeout_s)
    except GetTimeoutError:
        pass  # still starting: the next save waits for it within its own timeout
    return fresh


def release(named: dict, timeout_s: float = 30.0) -> None:
    """Kill actors ({name: handle}) and wait (bounded) until Ray reports each dead, which frees its
    name for a new actor. (A name lookup would not do: this process keeps handles to actors it
    created, and learns late of those lost with a node.)"""
    import ray
    for handle in named.values():
        try:
            ray.kill(handle)
        except Exception:  # already dead
            pass
    probes = [h.__ray_ready__.remote() for h in named.values()]
    if probes:
        ray.wait(probes, num_returns=len(probes), timeout=timeout_s)


def _here() -> str:
    import ray
    return ray.get_runtime_context().get_node_id()


def settle_nodes(node_ids, timeout_s: float = 60.0) -> set:
    """Wait (bounded) until each node is either answering or declared dead by Ray; returns the dead
    ones. A node whose raylet was just killed stays 'alive' in Ray's view until its health checks
    lapse, and groups placed there meanwhile would fail their actors: a small task pinned to each node
    answers quickly from a live node and fails once a dead one is declared dead."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    probe = ray.remote(num_cpus=0, max_retries=0)(_here)
    probes = {probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(): n
              for n in set(node_ids)}
    ray.wait(list(probes), num_returns=len(probes), timeout=timeout_s)
    dead = {x["NodeID"] for x in ray.nodes() if not x["Alive"]}
    return set(probes.values()) & dead


def teardown(actors: ActorSet) -> None:
    release(actors.all_handles())
    remove_groups(actors.groups)
