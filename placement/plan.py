"""Config -> placement plan: which bundles exist, on which node, and which actor sits where.

Pure: no Ray here, so `driver.py --dry-run` can print the plan on a laptop.

With `colocate_all`, every device (a GPU, or on the CPU default a slice of CPUs) is one bundle
holding one policy shard, one ref shard and one engine with fractional resources; bundles are
grouped node by node (one placement group per node, STRICT_PACK), so rank r of the policy sits
on node r // gpus_per_node. Without it, policy, ref and engines get pools of their own. The pools
of one kind (`spread`) go to distinct nodes (placement/groups.py); EnvPool and Checkpointer sit on
the driver's node (the head), outside the groups.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from settings.schema import Config

# Share of a colocated bundle each actor asks for. They take turns (engines sleep while the
# shards train), so these only have to fit, not to reflect use.
COLOCATED_SHARE = {"policy": 0.4, "ref": 0.2, "engine": 0.4}


@dataclass
class Slot:
    role: str          # policy | ref | engine
    name: str          # the named actor, e.g. FSDPPolicyShard-3
    rank: int
    num_cpus: float
    num_gpus: float


@dataclass
class Bundle:
    resources: dict
    slots: list[Slot] = field(default_factory=list)


@dataclass
class Pool:
    name: str
    node: int | None   # None: wherever Ray finds room
    bundles: list[Bundle]
    strategy: str = "STRICT_PACK"
    spread: str | None = None  # pools sharing this key are placed on distinct nodes


@dataclass
class Plan:
    use_gpu: bool
    pools: list[Pool]

    def slots(self, role: str) -> list[tuple[Pool, int, Slot]]:
        found = [(pool, i, s) for pool in self.pools for i, b in enumerate(pool.bundles)
                 for s in b.slots if s.role == role]
        return sorted(found, key=lambda t: t[2].rank)

    def total(self, resource: str) -> float:
        return sum(b.resources.get(resource, 0) for p in self.pools for b in p.bundles)


ROLE_NAMES = {"policy": "FSDPPolicyShard", "ref": "RefShard", "engine": "VLLMEngine"}


def _bundle(use_gpu: bool, cpus: float, device_resource: str | None = None) -> Bundle:
    resources = {"GPU": 1, "CPU": cpus} if use_gpu else {"CPU": cpus}
    return Bundle(resources | ({device_resource: 1} if device_resource else {}))


def _slot(role: str, rank: int, share: float, cpus: float, use_gpu: bool) -> Slot:
    return Slot(role, f"{ROLE_NAMES[role]}-{rank}", rank, round(cpus * share, 3),
                share if use_gpu else 0.0)


def make_plan(cfg: Config, use_gpu: bool) -> Plan:
    p, eng = cfg.trainer.placement, cfg.generator.inference_engine
    cpus = p.cpus_per_bundle
    with_ref = cfg.trainer.ref_source() == "shards"
    if p.colocate_all:
        pools = []
        for node in range(p.policy_num_nodes):
            bundles = []
            for local in range(p.policy_num_gpus_per_node):
                rank = node * p.policy_num_gpus_per_node + local
                b = _bundle(use_gpu, cpus, p.device_resource)
                b.slots.append(_slot("policy", rank, COLOCATED_SHARE["policy"], cpus, use_gpu))
                if with_ref:
                    b.slots.append(_slot("ref", rank, COLOCATED_SHARE["ref"], cpus, use_gpu))
                if rank % eng.tensor_parallel_size == 0:  # a TP engine's workers use the next bundles
                    b.slots.append(_slot("engine", rank // eng.tensor_parallel_size,
                                         COLOCATED_SHARE["engine"], cpus, use_gpu))
                bundles.append(b)
            pools.append(Pool(f"colocated-node{node}", node, bundles, spread="colocated"))
        return Plan(use_gpu, pools)

    pools = []
    for role, nodes, per_node in (("policy", p.policy_num_nodes, p.policy_num_gpus_per_node),
                                  ("ref", p.ref_num_nodes, p.ref_num_gpus_per_node)):
        if role == "ref" and not with_ref:
            continue
        for node in range(nodes):
            bundles = []
            for local in range(per_node):
                b = _bundle(use_gpu, cpus, p.device_resource)
                b.slots.append(_slot(role, node * per_node + local, 1.0, cpus, use_gpu))
                bundles.append(b)
            pools.append(Pool(f"{role}-node{node}", node, bundles, spread=role))
    for e in range(eng.num_engines):
        bundles = [_bundle(use_gpu, cpus, p.device_resource) for _ in range(eng.tensor_parallel_size)]
        bundles[0].slots.append(_slot("engine", e, 1.0, cpus, use_gpu))
        pools.append(Pool(f"engine-{e}", None, bundles, strategy="PACK"))
    return Plan(use_gpu, pools)


def format_plan(plan: Plan) -> str:
    device = "GPU" if plan.use_gpu else "CPU"
    engines = len(plan.slots("engine"))
    nodes = sorted({p.node for p in plan.pools if p.node is not None})
    lines = [f"placement plan ({device}): {len(plan.slots('policy'))} policy shards, "
             f"{len(plan.slots('ref'))} ref shards, {engines} engines on {len(nodes)} nodes; "
             f"needs {plan.total('GPU'):g} GPU, {plan.total('CPU'):g} CPU"]
    for pool in plan.pools:
        where = f"node {pool.node}" if pool.node is not None else "any node"
        apart = f", a node apart from the other {pool.spread} groups" if pool.spread and len(plan.pools) > 1 else ""
        lines.append(f"  placement group {pool.name} ({pool.strategy}{apart})")
        for i, b in enumerate(pool.bundles):
            res = ", ".join(f"{k}:{v:g}" for k, v in b.resources.items())
            actors = "; ".join(f"{s.name} (CPU {s.num_cpus:g}" + (f", GPU {s.num_gpus:g})" if plan.use_gpu else ")")
                               for s in b.slots) or "(TP worker)"
            lines.append(f"    bundle {i} {{{res}}} on {where}: {actors}")
    lines.append("  on the driver's node (the head), no reserved resources: EnvPool, Checkpointer")
    return "\n".join(lines)
