"""The run's long-lived actors and their lifecycle: start, teardown, restore from a checkpoint,
checkpoint saves with a time bound, recovery when an actor or a node is lost, and chaos kills.

The driver's step reaches the actors only through the clients held here (`engines`: sampling,
`trainer`: the policy and reference shards, `env`: the env pool), so a rebuild swaps every handle
at once. Recovery is a loop (docs/fault-tolerance.md): a fault while rebuilding counts as another
restart, up to `trainer.max_restarts`, with a growing pause between attempts; a lost node makes
the rebuild wait, up to `trainer.placement.recovery_timeout_s`, until the cluster can place the
groups again (a platform replacing the node). Every attempt is a line in recoveries.jsonl.
"""
from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from ray.exceptions import ActorUnavailableError, GetTimeoutError, ObjectLostError, RayActorError, RayTaskError

from actors.checkpointer import Checkpointer, CheckpointError, parse_step_path, resume_step
from actors.handles import EngineClient, Sync, TrainingClient, call_all
from controller.chaos import NODE_KILL_PHASES, Chaos, kill_actor, start_killer
from controller.launch import launch, restart_checkpointer, settle_nodes, teardown
from controller.rollouts import Rollouts, RolloutsAhead
from placement.groups import PlacementError
from placement.plan import make_plan
from rl.rollout import RolloutRunner
from rl.state import RunState
from settings import Config
from storage import adapters
from storage.adapters import AdapterRef
from storage.atomic import write_atomic

# What an actor's death looks like to the driver: a crashed, killed or unreachable actor, or an
# object that lived on a lost node (a ref shard's log-probs, say).
ACTOR_FAILURES = (RayActorError, ActorUnavailableError, ObjectLostError)


class GiveUp(RuntimeError):
    """More actor failures than trainer.max_restarts allows, or a cluster that never came back."""


def describe(error: BaseException) -> str:
    """One line for a log: a task's own error (its cause), not the actor's banner Ray puts first."""
    import re
    cause = getattr(error, "cause", None) or error
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(cause)).strip()
    first = text.splitlines()[0][:300] if text else ""
    return f"{type(cause).__name__}: {first}" if first else type(cause).__name__


def code_root(actor) -> str:
    """The folder an actor's code was imported from (a Ray Job's working directory, an image, a checkout)."""
    import inspect
    return str(Path(inspect.getfile(type(actor))).resolve().parent.parent)


class Fleet:
    def __init__(self, cfg: Config, total_steps: int, run_dir: Path, device: str, prompters: dict, chaos: Chaos | None = None,
                 start_from: str | None = None):
        self.cfg, self.total_steps, self.run_dir, self.device = cfg, total_steps, Path(run_dir), device
        self.start_from = start_from  # the checked trainer.policy.model.lora.init_from folder (None: the base)
        self.prompters = prompters
        self.plan = make_plan(cfg, use_gpu=device == "cuda")
        self.chaos = chaos or Chaos()
        self.actors = None
        self.restarts = 0
        self.durable_step = 0         # the newest step a checkpoint holds (0: none)
        self.save_failed = False      # the last save failed: the next step saves again
        self.placed_at = None         # when the groups of the current actors were placed (time.time())
        self.killers = {}             # node id -> the NodeKiller waiting there (--chaos-kill-node)
        # where each step's rollouts come from: generated in the step, or while the step before trained
        self.rollouts = RolloutsAhead(self) if cfg.trainer.fully_async.enabled else Rollouts(self)

    @property
    def takes_turns(self) -> bool:
        """Engines and shards take turns on each device (colocate_all with sleep): the engines sleep
        while the shards work, and the shards' weights wait in host memory while the engines generate."""
        return self.cfg.trainer.placement.colocate_all and self.cfg.generator.inference_engine.enable_sleep

    # ---- turns on a shared device -----------------------------------------------------------------
    def turn_to_engines(self) -> dict:
        """The engines awake to generate. Where they take turns with the shards, the shards' weights
        (and the cache their passes left) go to host memory first: an engine's cache must never grow
        beside a resident shard (an 8B step peaked at the card's edge when the eval did). Returns
        {memory/trainer_offloaded_gib: GiB moved} when something moved."""
        moved = self.trainer.offload() if self.takes_turns else 0.0
        self.engines.wake_up()
        return {"memory/trainer_offloaded_gib": moved} if moved else {}

    def turn_to_trainer(self) -> None:
        """The shards' weights on the device; where they take turns, the engines sleep first."""
        if self.takes_turns:
            self.engines.sleep()
            self.trainer.reload()

    # ---- start and stop ---------------------------------------------------------------------------
    def start(self, timeout_s: float | None = None) -> float:
        """Place and start the actors (the groups wait up to `timeout_s`, default
        trainer.placement.timeout_s); returns the seconds the groups took to be placed."""
        self.actors = launch(self.cfg, self.plan, self.cfg.trainer.policy.model.path, self.total_steps, timeout_s,
                             waiting=lambda message: print(f"waiting for the cluster: {message}", flush=True))
        self.placed_at = self.actors.placed_at
        self.engines = EngineClient(self.actors.engines)
        self.trainer = TrainingClient(self.actors.policy, self.actors.ref,
                                      ref_from_policy=self.cfg.trainer.ref_source() == "policy")
        self.env = Sync(self.actors.env_pool)
        self.runner = RolloutRunner.from_config(self.cfg, self.engines.generate, self.prompters, self.env)
        self._write_placement()
        if self.chaos.node_kills:
            self._start_killers()
        return self.actors.placement_s

    def _write_placement(self) -> None:
        """{run_dir}/placement.json: which node holds each named actor (rewritten at every start)."""
        import ray
        handles = self.actors.all_handles()
        code = dict(zip(handles, ray.get([h.__ray_call__.remote(code_root) for h in handles.values()])))
        record = {"time": time.time(), "namespace": self.cfg.ray.namespace,
                  "driver_node": ray.get_runtime_context().get_node_id(), "actors": self.actors.nodes,
                  "code": code}
        write_atomic(self.run_dir / "placement.json", json.dumps(record, indent=2) + "\n")
        nodes = sorted(set(self.actors.nodes.values()))
        print(f"placed {len(self.actors.nodes)} actors on {len(nodes)} node(s): " + "; ".join(
            f"{n[:8]}: {', '.join(a for a, m in self.actors.nodes.items() if m == n)}" for n in nodes), flush=True)

    def teardown(self) -> None:
        import ray
        if self.actors is not None:
            teardown(self.actors)
            self.actors = None
        for killer in self.killers.values():
            ray.kill(killer)
        self.killers = {}

    def is_actor_failure(self, error: BaseException, wait_s: float = 60.0) -> bool:
        """Is `error` the loss of an actor (or of its node)? Beside Ray's own actor errors, a task
        error counts when one of the run's actors or nodes died meanwhile: a shard whose collective
        peer was lost fails first, with the peer's connection error, before Ray has declared the peer
        dead (on a lost node that takes Ray's health checks, ~15 s): that is waited for, up to wait_s."""
        if isinstance(error, ACTOR_FAILURES) or isinstance(getattr(error, "cause", None), ACTOR_FAILURES):
            return True
        if not isinstance(error, RayTaskError) or self.actors is None:
            return False
        import ray
        ours = set(self.actors.nodes.values())
        pending = [h.__ray_ready__.remote() for h in self.actors.all_handles().values()]
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if any(not n["Alive"] and n["NodeID"] in ours for n in ray.nodes()):
                return True
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            for ref in done:
                try:
                    ray.get(ref)
                except ACTOR_FAILURES:
                    return True
        return False

    def check_alive(self) -> None:
        """Every actor answers (raises an actor failure otherwise)."""
        import ray
        ray.get([h.__ray_ready__.remote() for h in self.actors.all_handles().values()])

    def peak_memory(self) -> dict:
        """{memory/<actor>_peak_gib: the GPU memory high-water mark of each GPU actor} (empty on the CPU)."""
        if self.device != "cuda":
            return {}
        named = {n: h for n, h in self.actors.all_handles().items() if n.startswith(("VLLM", "FSDP", "Ref"))}
        return {f"memory/{n}_peak_gib": v for n, v in zip(named, call_all(list(named.values()), "peak_memory_gib"))}

    # ---- checkpoints ------------------------------------------------------------------------------
    def restore(self, state: RunState, mode: str, step: int | None = None) -> float | None:
        """Load the checkpoint `mode` names (latest | from_path) into the shards, the engines and
        `state`; returns the seconds it took, or None when there is nothing to resume from. With
        mode=latest, `step` is the checkpoint already chosen (else the newest that verifies)."""
        t = self.cfg.trainer
        if mode == "from_path":
            root, step = parse_step_path(t.resume_path)
            source = Sync(Checkpointer(root, self.cfg.s3))
        elif mode == "latest":
            source = Sync(self.actors.checkpointer)
            step = step if step is not None else resume_step(source, t.ckpt_path)
        if mode == "none" or step is None:
            self.start_adapter(state)
            return None
        started = time.perf_counter()
        trainer_state = source.load_trainer_state(step)
        adapter = RunState.adapter_of(trainer_state, self.run_dir / "adapters")
        # the checkpoint's adapter files land in its version's folder as the policy state is loaded
        self.trainer.load_state_dict(source.load_policy_state(step, adapter.path if adapter else
                                                              str(self.run_dir / "adapters" / "v0")))
        state.restore(trainer_state, adapter, adapters.exported_best(t.export_path, self.cfg.s3))
        # the engines take the adapter the next rollouts are sampled with: one-step-off, the batch in flight's
        rollout = self._rollout_adapter(state)
        if rollout is not None and rollout.version != state.version:
            source.load_rollout_adapter(step, rollout.path)
        if rollout is not None:
            self.engines.load_adapter(rollout)
        self.durable_step, self.save_failed = state.step, False
        return time.perf_counter() - started

    def start_adapter(self, state: RunState) -> None:
        """A run with nothing to resume starts from the base, or from trainer.policy.model.lora.init_from:
        the shards take its weights and write them as adapter v1, which the engines load, so the
        step-0 eval and the first rollouts see what the trainer holds."""
        if self.start_from is None:
            return
        self.trainer.load_adapter_weights(adapters.read_weights(self.start_from, self.cfg.s3))
        adapter = adapters.version_ref(self.run_dir / "adapters", 1)
        self.trainer.save_adapter(adapter.path)
        self.engines.load_adapter(adapter)
        state.adapter = adapter

    def _rollout_adapter(self, state: RunState) -> AdapterRef | None:
        """The adapter the next rollouts are sampled with (None: the base)."""
        version = state.rollout_version
        if version == state.version:
            return state.adapter
        return adapters.version_ref(self.run_dir / "adapters", version)

    def checkpoint(self, state: RunState, config_yaml: str, line: dict | None = None) -> dict:
        """Save the full training state of `state.step` (and `line`, the step's metrics line when it is
        not logged yet), in at most trainer.ckpt_timeout_s. A failed save is reported and the next step
        saves again; with trainer.fail_on_ckpt_error it stops the run."""
        import ray
        t = self.cfg.trainer
        started = time.perf_counter()
        try:
            self.turn_to_trainer()  # the optimizer's state is gathered on the device
            policy_state = self.trainer.state_dict()
            rollout = self._rollout_adapter(state)  # one-step-off: the batch in flight's, when older
            ref = self.actors.checkpointer.save.remote(state.step, state.snapshot(self.total_steps, config_yaml, line),
                                                       policy_state, state.adapter.path,
                                                       rollout.path if rollout and rollout.version != state.version
                                                       else None)
            try:
                info = ray.get(ref, timeout=t.ckpt_timeout_s)
            except GetTimeoutError:
                # a store that stopped answering: drop the stuck actor so the next save starts clean
                self.actors.checkpointer = restart_checkpointer(self.cfg, self.actors.checkpointer)
                raise CheckpointError(f"saving step {state.step} to {t.ckpt_path} took more than "
                                      f"trainer.ckpt_timeout_s={t.ckpt_timeout_s:g}s") from None
        except CheckpointError as e:
            self.save_failed = True
            if t.fail_on_ckpt_error:
                raise
            print(f"WARNING: checkpoint of step {state.step} failed, training goes on and the next step "
                  f"saves again: {e}", flush=True)
            return {"ckpt/failed": 1.0, "ckpt/save_s": time.perf_counter() - started}
        self.durable_step, self.save_failed = state.step, False
        return {"ckpt/failed": 0.0, "ckpt/save_s": info["seconds"], "ckpt/bytes": info["bytes"],
                "ckpt/bytes_per_s": info["bytes"] / max(info["seconds"], 1e-9)}

    def interval_hint(self, step_s: float) -> str | None:
        """The checkpoint interval the rule "every MTTF / 3" gives at this step time, beside the config's
        (None without trainer.hours_between_failures)."""
        t = self.cfg.trainer
        if not t.hours_between_failures:
            return None
        every_s = t.hours_between_failures * 3600 / 3
        steps = max(1, int(every_s // step_s))
        return (f"checkpoint interval: a failure every {t.hours_between_failures:g} h (trainer.hours_between_failures) "
                f"calls for a checkpoint every {every_s / 60:.0f} min (MTTF / 3): {steps} steps of {step_s:.1f} s; "
                f"trainer.ckpt_interval is {t.ckpt_interval}")

    def make_last_save_durable(self, state: RunState, config_yaml: str) -> int:
        """A failed save is tried again at the next step; the last step has none, so its save is tried
        once more here. If it still fails, the run says which step is durable and exits non-zero (3)
        instead of ending as if all were well. Returns the run's exit status."""
        if self.save_failed:
            print(f"retrying the checkpoint of step {state.step}", flush=True)
            self.checkpoint(state, config_yaml)
        if not self.save_failed:
            return 0
        print(f"ERROR: the checkpoint of step {state.step} could not be saved to {self.cfg.trainer.ckpt_path}; the "
              f"last durable checkpoint is step {self.durable_step}. Fix the store and run the same command again "
              f"to resume from there.", file=sys.stderr, flush=True)
        return 3

    # ---- faults -----------------------------------------------------------------------------------
    def recover(self, failure: BaseException, state: RunState, failed_step: int) -> dict:
        """An actor (or its node) was lost during `failed_step`: tear everything down, rebuild (waiting
        for the cluster to offer the groups again, up to trainer.placement.recovery_timeout_s), reload
        the newest checkpoint into `state`. Retried while trainer.max_restarts allows; returns the last
        record, with `placement_wait_s`: how long the groups took to be placed."""
        t = self.cfg.trainer
        max_restarts, completed = t.max_restarts, failed_step - 1
        attempt = 0
        while True:
            self.restarts += 1
            attempt += 1
            cause = describe(failure)
            if self.restarts > max_restarts:
                raise GiveUp(f"giving up after {self.restarts - 1} restarts (trainer.max_restarts={max_restarts}); "
                             f"last failure at step {failed_step}: {cause}") from failure
            print(f"RECOVERY {self.restarts}/{max_restarts}: step {failed_step} failed: {cause}", flush=True)
            started = time.perf_counter()
            record = {"restart": self.restarts, "attempt": attempt, "failed_step": failed_step, "cause": cause,
                      "time": time.time()}
            try:
                hosts = set(self.actors.nodes.values()) if self.actors is not None else set()
                self.rollouts.cancel()  # the batch in flight stops; the checkpoint says which to generate again
                self.teardown()
                self.rollouts.reset()
                record["lost_nodes"] = sorted(settle_nodes(hosts))  # dead ones declared so: none of them is chosen
                record["teardown_s"] = time.perf_counter() - started
                record["placement_wait_s"] = self.start(timeout_s=t.placement.recovery_timeout_s)
                record["start_s"] = time.perf_counter() - started - record["teardown_s"]  # placement included
                if self.chaos.in_recovery and attempt == 1 and self.restarts == 1:
                    self.kill_one(self.actors.all_handles(), "EnvPool", "sigkill", note="during recovery")
                state.reset()
                record["restore_s"] = self.restore(state, "latest") or 0.0
                self.check_alive()
            except PlacementError as e:  # the cluster did not come back within recovery_timeout_s
                record |= {"ok": False, "error": describe(e), "rebuild_s": time.perf_counter() - started}
                self._append("recoveries.jsonl", record)
                raise GiveUp(f"the lost actors could not be placed again: {e}") from failure
            except ACTOR_FAILURES as e:
                record |= {"ok": False, "error": describe(e), "rebuild_s": time.perf_counter() - started}
                self._append("recoveries.jsonl", record)
                failure = e
                time.sleep(min(30.0, 2.0 ** (attempt - 1)))
                continue
            record |= {"ok": True, "resumed_from": state.step, "steps_lost": completed - state.step,
                       "rebuild_s": time.perf_counter() - started}
            self._append("recoveries.jsonl", record)
            print(f"RECOVERY {self.restarts}: resumed at step {state.step}{state.in_flight_note()}; "
                  f"{record['steps_lost']} step(s) done since that checkpoint are lost and redone "
                  f"({record['rebuild_s']:.1f}s, of which {record['placement_wait_s']:.1f}s waiting for the cluster)",
                  flush=True)
            return record

    def step_done_after_recovery(self, record: dict) -> dict:
        """Metrics of the first step finished after a recovery: from the groups being placed again
        (a replacement node had joined) to this step's end."""
        back = time.time() - self.placed_at
        self._amend_recovery(record["restart"], {"back_to_step_s": back})
        print(f"RECOVERY {record['restart']}: step finished {back:.1f}s after the groups were placed again", flush=True)
        return {"recovery/placement_wait_s": record["placement_wait_s"], "recovery/back_to_step_s": back}

    # ---- chaos ------------------------------------------------------------------------------------
    def chaos_kill(self, step: int) -> str:
        """Kill a random actor after `step` (--chaos-kill-every)."""
        c = self.chaos
        method = ("sigkill", "ray_kill")[c.kills % 2] if c.method == "mixed" else c.method
        c.kills += 1
        c.steps.add(step)
        handles = self.actors.all_handles()
        name = random.Random(step).choice(sorted(handles))
        return self.kill_one(handles, name, method, note=f"after step {step}", step=step)

    def kill_one(self, handles: dict, name: str, method: str, note: str, step: int | None = None) -> str:
        self._append("chaos.jsonl", {"time": time.time(), "after_step": step, "actor": name, "method": method,
                                     "note": note})
        print(f"CHAOS: {'ray.kill(' + name + ')' if method == 'ray_kill' else 'SIGKILL ' + name} {note}", flush=True)
        kill_actor(handles[name], method)
        return name

    def _policy_nodes(self) -> list[str]:
        import ray
        head = ray.get_runtime_context().get_node_id()
        nodes = [self.actors.nodes[name] for name in sorted(self.actors.nodes) if name.startswith("FSDPPolicyShard")]
        return [n for n in dict.fromkeys(nodes) if n != head]

    def _start_killers(self) -> None:
        nodes = self._policy_nodes()
        if not nodes:
            raise ValueError("--chaos-kill-node needs policy shards on worker nodes, not on the driver's node "
                             "(a multi-node cluster: deploy/local_cluster.py)")
        self.killers = {n: start_killer(n) for n in nodes}

    def chaos_at_phase(self, step: int, phase: str) -> None:
        """--chaos-kill-node: at the start of `phase` of `step`, the kill of a policy shard's node."""
        c = self.chaos
        if not c.node_due(phase, step):
            return
        nodes = self._policy_nodes()
        node = nodes[len(c.nodes_killed) % len(nodes)]
        c.nodes_killed.append((phase, step))
        holds = [a for a, n in self.actors.nodes.items() if n == node]
        delay = NODE_KILL_PHASES[phase]
        how = c.node_signals.get((phase, step), "sigkill")
        self._append("chaos.jsonl", {"time": time.time(), "step": step, "phase": phase, "node": node,
                                     "actors": holds, "method": "node", "signal": how, "delay_s": delay})
        print(f"CHAOS: {how} to node {node[:8]} ({', '.join(holds)}) {delay:g}s into {phase} of step {step}", flush=True)
        self.killers[node].kill.remote(delay, how)

    def _amend_recovery(self, restart: int, fields: dict) -> None:
        """Add fields to the recoveries.jsonl line of restart number `restart` (rewritten whole)."""
        path = self.run_dir / "recoveries.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        lines = [r | fields if r["restart"] == restart and r.get("ok") else r for r in lines]
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in lines))

    def _append(self, name: str, record: dict) -> None:
        with open(self.run_dir / name, "a") as f:
            f.write(json.dumps(record) + "\n")
