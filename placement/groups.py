"""Placement groups from a plan, with a deadline: an unsatisfiable group fails with a message that
says which resources are missing, instead of hanging the driver.

Pools of one kind (`Pool.spread`: one per node of the plan) must land on distinct nodes, as the
reference's 3 nodes x 2 GPUs do: two STRICT_PACK groups would otherwise share a node that has room
for both. They are created one after another, each told by a label selector to avoid the nodes the
earlier ones took (`ray.io/node-id`, a label every Ray node carries).
"""
from __future__ import annotations

import time

from placement.plan import Plan

NODE_ID_LABEL = "ray.io/node-id"


class PlacementError(RuntimeError):
    pass


def create_groups(plan: Plan, timeout_s: float, waiting=None, report_every_s: float = 30.0) -> dict:
    """{pool name: placement group}, all placed within `timeout_s`. `waiting(message)` is told, every
    `report_every_s` while groups wait, what the cluster lacks (recovery prints it)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    deadline = time.monotonic() + timeout_s
    groups, taken = {}, {}

    def wait(pending: dict) -> None:
        next_report = time.monotonic() + report_every_s
        while pending:
            left = deadline - time.monotonic()
            ready, _ = ray.wait(list(pending.values()), timeout=max(0.0, min(left, next_report - time.monotonic())))
            pending = {n: r for n, r in pending.items() if r not in ready}
            if pending and time.monotonic() >= deadline:
                for pg in groups.values():
                    remove_placement_group(pg)
                raise PlacementError(_missing_message(plan, sorted(pending), timeout_s))
            if pending and waiting is not None and time.monotonic() >= next_report:
                waiting(_missing_message(plan, sorted(pending), timeout_s, waited=timeout_s - left))
                next_report = time.monotonic() + report_every_s

    for pool in plan.pools:
        avoid = taken.get(pool.spread, []) if pool.spread else []
        selector = [{NODE_ID_LABEL: f"!in({','.join(avoid)})"}] * len(pool.bundles) if avoid else None
        pg = placement_group([dict(b.resources) for b in pool.bundles], strategy=pool.strategy,
                             name=f"visrl-{pool.name}", bundle_label_selector=selector)
        groups[pool.name] = pg
        if pool.spread:  # its node must be known before the next pool of its kind is asked for
            wait({pool.name: pg.ready()})
            taken.setdefault(pool.spread, []).append(group_node(pg))
    wait({name: pg.ready() for name, pg in groups.items()})
    return groups


def group_node(pg) -> str:
    """The node of a placed STRICT_PACK group's first bundle."""
    from ray.util.placement_group import placement_group_table
    return placement_group_table(pg)["bundles_to_node_id"][0]


def _missing_message(plan: Plan, pending: list[str], timeout_s: float, waited: float | None = None) -> str:
    import ray
    total = ray.cluster_resources()
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    need = {}
    for pool in plan.pools:
        for b in pool.bundles:
            for k, v in b.resources.items():
                need[k] = need.get(k, 0) + v
    lines = [f"placement groups {', '.join(pending)} not placed after {waited:.0f}s; waiting up to {timeout_s:g}s."
             if waited is not None else
             f"placement groups {', '.join(pending)} could not be placed within {timeout_s:g}s "
             f"(trainer.placement.timeout_s, or recovery_timeout_s after a lost node)."]
    for k, v in sorted(need.items()):
        have = total.get(k, 0)
        flag = "  <-- missing" if have < v else ""
        lines.append(f"  {k}: plan needs {v:g}, cluster has {have:g}{flag}")
    per_node = [{k: v for k, v in n.get("Resources", {}).items()
                 if not k.startswith("node:") and k not in ("memory", "object_store_memory")} for n in nodes]
    lines.append(f"  {len(nodes)} node(s): {per_node}")
    spread = sorted({p.spread for p in plan.pools if p.spread})
    lines.append("  Bundles of one placement group must fit on one node (STRICT_PACK), and the groups of one kind "
                 f"({', '.join(spread) or 'none here'}) on distinct nodes; lower trainer.placement.cpus_per_bundle "
                 "or the GPU counts, or add nodes.")
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
