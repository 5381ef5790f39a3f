"""The run's long-lived actors and their lifecycle: start, teardown, restore from a checkpoint,
checkpoint saves with a time bound, recovery when an actor dies, and chaos kills.

The driver's step reaches the actors only through the clients held here (`engines`: sampling,
`trainer`: the policy and reference shards, `env`: the env pool), so a rebuild swaps every handle
at once. Recovery is a loop (docs/fault-tolerance.md): a fault while rebuilding counts as another
restart, up to `trainer.max_restarts`, with a growing pause between attempts; every attempt is a
line in recoveries.jsonl.
"""
from __future__ import annotations

import json
import os
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

from actors.checkpointer import Checkpointer, CheckpointError, parse_step_path, resume_step
from actors.handles import EngineClient, Sync, TrainingClient, call_all
from inference.requests import AdapterRef
from placement.groups import PlacementError
from placement.launch import launch, restart_checkpointer, teardown
from placement.plan import make_plan
from rl.rollout import RolloutRunner
from rl.state import RunState

# What an actor's death looks like to the driver (a crashed, killed or unreachable actor).
ACTOR_FAILURES = (RayActorError, ActorUnavailableError)


class GiveUp(RuntimeError):
    """More actor failures than trainer.max_restarts allows."""


def describe(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


@dataclass
class Chaos:
    """--chaos-kill-every: kill a random actor every N steps, by SIGKILL of its process (as a crash
    would), with ray.kill, or alternating ("mixed"); with `in_recovery`, also kill one while the
    first recovery is rebuilding (a second fault)."""
    every: int = 0
    method: str = "sigkill"
    in_recovery: bool = False
    kills: int = 0
    steps: set = field(default_factory=set)  # a step redone after a recovery is not killed again

    def due(self, step: int, total_steps: int) -> bool:
        return bool(self.every) and step % self.every == 0 and step < total_steps and step not in self.steps


class Fleet:
    def __init__(self, cfg, total_steps: int, run_dir: Path, device: str, prompter, chaos: Chaos | None = None):
        self.cfg, self.total_steps, self.run_dir, self.device = cfg, total_steps, Path(run_dir), device
        self.prompter = prompter
        self.plan = make_plan(cfg, use_gpu=device == "cuda")
        self.chaos = chaos or Chaos()
        self.actors = None
        self.restarts = 0
        self.durable_step = 0         # the newest step a checkpoint holds (0: none)
        self.save_failed = False      # the last save failed: the next step saves again

    # ---- start and stop ---------------------------------------------------------------------------
    def start(self) -> None:
        self.actors = launch(self.cfg, self.plan, self.cfg.trainer.policy.model.path, self.total_steps)
        self.engines = EngineClient(self.actors.engines)
        self.trainer = TrainingClient(self.actors.policy, self.actors.ref,
                                      ref_from_policy=self.cfg.trainer.ref_source() == "policy")
        self.env = Sync(self.actors.env_pool)
        self.runner = RolloutRunner.from_config(self.cfg, self.engines.generate, self.prompter, self.env)

    def teardown(self) -> None:
        if self.actors is not None:
            teardown(self.actors, self.cfg.ray.namespace)
            self.actors = None

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
        if mode == "none":
            return None
        if mode == "from_path":
            root, step = parse_step_path(t.resume_path)
            source = Sync(Checkpointer(root, self.cfg.s3))
        else:
            source = Sync(self.actors.checkpointer)
            step = step if step is not None else resume_step(source, t.ckpt_path)
            if step is None:
                return None
        started = time.perf_counter()
        trainer_state = source.load_trainer_state(step)
        version = int(trainer_state["adapter_version"])
        folder = self.run_dir / "adapters" / f"v{version}"
        self.trainer.load_state_dict(source.load_policy_state(step, str(folder)))
        adapter = AdapterRef(str(folder), version) if version else None
        if adapter:
            self.engines.load_adapter(adapter)
        state.restore(trainer_state, adapter, self.exported_best())
        self.durable_step, self.save_failed = state.step, False
        return time.perf_counter() - started

    def exported_best(self) -> dict | None:
        """The selection.json of the adapter the validation set chose (driver.choose_adapter), if any."""
        from storage import open_store
        store = open_store(self.cfg.trainer.export_path, self.cfg.s3)
        return json.loads(store.get_bytes("best/selection.json")) if store.exists("best/selection.json") else None

    def checkpoint(self, state: RunState, config_yaml: str) -> dict:
        """Save the full training state of `state.step`, in at most trainer.ckpt_timeout_s. A failed
        save is reported and the next step saves again; with trainer.fail_on_ckpt_error it stops the run."""
        import ray
        t = self.cfg.trainer
        started = time.perf_counter()
        try:
            policy_state = self.trainer.state_dict()
            ref = self.actors.checkpointer.save.remote(state.step, state.snapshot(self.total_steps, config_yaml),
                                                       policy_state, state.adapter.path)
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
        return {"ckpt/failed": 0.0, "ckpt/save_s": info["seconds"], "ckpt/bytes": info["bytes"]}

    # ---- faults -----------------------------------------------------------------------------------
    def recover(self, failure: BaseException, state: RunState, failed_step: int) -> dict:
        """An actor died during `failed_step`: tear everything down, rebuild, reload the newest
        checkpoint into `state`. Retried while trainer.max_restarts allows; returns the last record."""
        max_restarts, completed = self.cfg.trainer.max_restarts, failed_step - 1
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
            record = {"restart": self.restarts, "attempt": attempt, "failed_step": failed_step, "cause": cause}
            try:
                self.teardown()
                self.start()
                if self.chaos.in_recovery and attempt == 1 and self.restarts == 1:
                    self.kill_one(self.actors.all_handles(), "EnvPool", "sigkill", note="during recovery")
                state.reset()
                self.restore(state, "latest")
                self.check_alive()
            except ACTOR_FAILURES + (PlacementError,) as e:
                record |= {"ok": False, "error": describe(e), "rebuild_s": time.perf_counter() - started}
                self._append("recoveries.jsonl", record)
                failure = e
                time.sleep(min(30.0, 2.0 ** (attempt - 1)))
                continue
            record |= {"ok": True, "resumed_from": state.step, "steps_lost": completed - state.step,
                       "rebuild_s": time.perf_counter() - started}
            self._append("recoveries.jsonl", record)
            print(f"RECOVERY {self.restarts}: resumed at step {state.step}; {record['steps_lost']} step(s) done "
                  f"since that checkpoint are lost and redone ({record['rebuild_s']:.1f}s)", flush=True)
            return record

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
        import ray
        handle = handles[name]
        self._append("chaos.jsonl", {"time": time.time(), "after_step": step, "actor": name, "method": method,
                                     "note": note})
        if method == "ray_kill":
            print(f"CHAOS: ray.kill({name}) {note}", flush=True)
            ray.kill(handle)
        else:
            pid = ray.get(handle.__ray_call__.remote(lambda actor: os.getpid()))
            print(f"CHAOS: SIGKILL {name} (pid {pid}) {note}", flush=True)
            os.kill(pid, signal.SIGKILL)
        return name

    def _append(self, name: str, record: dict) -> None:
        with open(self.run_dir / name, "a") as f:
            f.write(json.dumps(record) + "\n")
