"""Placement groups from a plan, with a deadline: an unsatisfiable group fails with a message that
says which resources are missing, instead of hanging the driver."""
from __future__ import annotations

import time

from placement.plan import Plan


class PlacementError(RuntimeError):
    pass


def create_groups(plan: Plan, timeout_s: float) -> dict:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    groups = {pool.name: placement_group([dict(b.resources) for b in pool.bundles], strategy=pool.strategy,
                                         name=f"visrl-{pool.name}")
              for pool in plan.pools}
    deadline = time.monotonic() + timeout_s
    pending = {name: pg.ready() for name, pg in groups.items()}
    while pending:
        ready, _ = ray.wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic()))
        pending = {n: r for n, r in pending.items() if r not in ready}
        if pending and time.monotonic() >= deadline:
            for pg in groups.values():
                remove_placement_group(pg)
            raise PlacementError(_missing_message(plan, sorted(pending), timeout_s))
    return groups


def _missing_message(plan: Plan, pending: list[str], timeout_s: float) -> str:
    import ray
    total = ray.cluster_resources()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    need = {}
    for pool in plan.pools:
        for b in pool.bundles:
            for k, v in b.resources.items():
                need[k] = need.get(k, 0) + v
    lines = [f"placement groups {', '.join(pending)} could not be placed within {timeout_s:g}s "
             f"(trainer.placement.timeout_s)."]
    for k, v in sorted(need.items()):
        have = total.get(k, 0)
        flag = "  <-- missing" if have < v else ""
        lines.append(f"  {k}: plan needs {v:g}, cluster has {have:g}{flag}")
    per_node = [{k: v for k, v in n.get("Resources", {}).items() if k in ("CPU", "GPU")} for n in nodes]
    lines.append(f"  {len(nodes)} node(s): {per_node}")
    lines.append("  Bundles of one placement group must fit on one node (STRICT_PACK); lower "
                 "trainer.placement.cpus_per_bundle or the GPU counts, or add nodes.")
    return "\n".join(lines)


def remove_groups(groups: dict) -> None:
    from ray.util.placement_group import remove_placement_group
    for pg in groups.values():
        try:
            remove_placement_group(pg)
        except Exception:
            pass


def bundle_nodes(groups: dict) -> dict:
    """{(pool name, bundle index): node id} as Ray placed them."""
    from ray.util.placement_group import placement_group_table
    out = {}
    for name, pg in groups.items():
        table = placement_group_table(pg)
        for idx, node in table.get("bundles_to_node_id", {}).items():
            out[(name, int(idx))] = node
    return out
