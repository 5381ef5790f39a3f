"""Chaos: faults on purpose, to check a recovery set-up end to end (docs/fault-tolerance.md).

    --chaos-kill-every N          an actor killed after every N steps (SIGKILL of its process, or ray.kill)
    --chaos-in-recovery           also the EnvPool, while the first recovery rebuilds the actors
    --chaos-kill-node PHASE@STEP  a worker node killed during a phase of a step (generate, train, ckpt, ...)

A node is killed as hardware fails: a small actor placed on it SIGKILLs the node's raylet and every
process under it (the object store, the agents, each actor's worker), itself included, while the
phase's calls are in flight: half a second into the long phases (generate, train, eval), at once
in the short ones (a checkpoint save takes a fraction of a second). The node chosen holds a policy
shard (rank k for the k-th kill, round robin); the driver's own node is never chosen. Whatever replaces the node
(a platform, or `deploy/local_cluster.py platform` here) is not the driver's business: recovery
waits until the placement groups can be placed again. Each kill is a line in chaos.jsonl.
`PHASE@STEP:sigterm` sends SIGTERM instead (a pod deletion); `PHASE@STEP:drain` first does what a
worker pod's preStop hook does (controller/drain.py: ask the driver for a checkpoint and wait for
it), then sends SIGTERM.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

# phase -> seconds into it that the kill lands
NODE_KILL_PHASES = {"generate": 0.5, "train": 0.5, "eval": 0.5, "ref": 0.0, "sync": 0.0, "export": 0.0, "ckpt": 0.0}


# a power cut; a pod deletion; a pod deletion after its preStop hook asked for a checkpoint
NODE_SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "drain": signal.SIGTERM}
DRAIN_TIMEOUT_S = 300.0  # the chaos drain's wait for the driver's checkpoint (a preStop hook's --timeout)


def parse_node_kills(specs: list[str]) -> tuple[list[tuple[str, int]], dict]:
    """["train@5", "ckpt@7:sigterm", ...] -> ([("train", 5), ("ckpt", 7)], {("ckpt", 7): "sigterm"}): where
    to kill a node and, where not SIGKILL, with which signal; a malformed one is a ValueError that says the form."""
    out, signals = [], {}
    for spec in specs:
        at, _, how = spec.partition(":")
        phase, _, step = at.partition("@")
        if phase not in NODE_KILL_PHASES or not step.isdigit() or int(step) < 1 or (how and how not in NODE_SIGNALS):
            raise ValueError(f"--chaos-kill-node {spec!r}: expected PHASE@STEP[:sigterm|:drain] with PHASE one "
                             f"of {', '.join(NODE_KILL_PHASES)} and STEP >= 1 (e.g. train@5; train@5:sigterm for a "
                             "pod deletion's SIGTERM instead of a power cut's SIGKILL; train@5:drain for a pod "
                             "deletion whose preStop hook asks for a checkpoint first)")
        out.append((phase, int(step)))
        if how:
            signals[(phase, int(step))] = how
    return out, signals


@dataclass
class Chaos:
    every: int = 0
    method: str = "sigkill"
    in_recovery: bool = False
    node_kills: list = field(default_factory=list)  # [(phase, step)]
    node_signals: dict = field(default_factory=dict)  # {(phase, step): "sigterm"}; SIGKILL where absent
    kills: int = 0
    steps: set = field(default_factory=set)  # a step redone after a recovery is not killed again
    nodes_killed: list = field(default_factory=list)

    def due(self, step: int, total_steps: int) -> bool:
        return bool(self.every) and step % self.every == 0 and step < total_steps and step not in self.steps

    def node_due(self, phase: str, step: int) -> bool:
        return (phase, step) in self.node_kills and (phase, step) not in self.nodes_killed


def _sigkill_self(actor) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def kill_actor(handle, method: str, wait_s: float = 60.0) -> None:
    """SIGKILL the actor's process (a crash; sent from inside it, so it works on any node), or
    ray.kill it; returns once the actor is gone (or wait_s passed)."""
    import ray
    if method == "ray_kill":
        ray.kill(handle)
    else:
        ray.wait([handle.__ray_call__.remote(_sigkill_self)], timeout=wait_s)


class NodeKiller:
    """Lives on the node it kills (placed there by node affinity, reserving nothing)."""

    def kill(self, delay_s: float, how: str = "sigkill") -> None:
        import psutil
        time.sleep(delay_s)
        if how == "drain":
            import ray

            from controller import drain
            saved = drain.request(ray.get_runtime_context().get_node_id(), DRAIN_TIMEOUT_S)
            print(f"drain: saved {saved}", flush=True)
        raylet = psutil.Process(os.getppid())  # a worker's parent is its node's raylet
        victims = [raylet] + raylet.children(recursive=True)
        for p in victims:  # all at once: no process outlives the raylet to notice
            try:
                p.send_signal(NODE_SIGNALS[how])
            except psutil.Error:
                pass


def start_killer(node_id: str):
    """A NodeKiller on `node_id`, started (its process up) so that a kill lands at once when asked."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    killer = ray.remote(NodeKiller).options(
        num_cpus=0, max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    ray.get(killer.__ray_ready__.remote())
    return killer
