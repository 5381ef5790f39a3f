"""Where a step's rollouts come from: generated in the step (synchronous), or generated while the
step before trained (one-step-off, `trainer.fully_async.enabled`).

One-step-off: step k takes batch k, which the engines generated while step k-1 trained, with the
adapter they held then (v(k-2)); it draws batch k+1 and starts it at once, with the newest adapter
(v(k-1)), in a thread of the driver, and trains on batch k meanwhile. The trainer is one adapter
version ahead of the rollouts it trains on, never more, and the loss corrects for that with
truncated importance sampling (trainer.algorithm.use_tis). The engines load each adapter as the
batch that uses it starts, not at the step's sync; an eval waits for the batch in flight and loads
the trainer's adapter first.

What is in flight is part of the run's state (RunState.ahead: the sampler's position before the
batch was drawn and the adapter version it is sampled with): a checkpoint records it, with that
adapter's files when they are not the policy's, and a resume draws and generates the same batch
with the same adapter, so no step's rollouts are repeated or dropped. A step abandoned before its
update (SIGTERM, a node draining) puts everything back as it was when the step began: its batch,
already generated, is kept for the rerun (or generated again, if it was still in flight). A lost
actor cancels the batch in flight; the recovery's checkpoint says which batch to generate again.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from rl.rollout import rollout_tasks, training_sampling
from storage.adapters import AdapterRef, version_ref

WAIT_POLL_S = 0.5  # how often a step waiting for its batch looks for SIGTERM or a draining node


class Cancelled(Exception):
    """The batch in flight was given up (an actor was lost, or the step abandoned)."""


class Rollouts:
    """Synchronous: each step draws its batch and generates it with the trainer's adapter, then trains."""

    def __init__(self, fleet):
        self.fleet = fleet
        self.drawn_from = None  # the sampler's position before this step's batch

    def take(self, step: int, state, phases, preemption) -> tuple[list, int, dict]:
        """(the step's episodes, their epoch, {"seconds": generation time, "metrics": ...})."""
        g = self.fleet.cfg.generator
        self.drawn_from = state.sampler.state_dict()  # before the phase: a SIGTERM may abandon the step as it starts
        with phases("sample"):
            rows, epoch = state.sampler.next_batch()
            tasks = rollout_tasks(rows, step, g.n_samples_per_prompt)
        with phases("wake"):
            metrics = self.fleet.turn_to_engines()
        with phases("generate"):
            episodes = self.fleet.runner.run(tasks, training_sampling(self.fleet.cfg, step), state.version,
                                             between_turns=preemption.check, explore=g.explore_revisits)
        state.sampler.record_outcomes(episodes)  # mixed groups queue their maze for replay (data.replay_share)
        return episodes, epoch, {"seconds": phases.seconds["generate"], "metrics": metrics}

    def publish(self, adapter: AdapterRef, phases) -> dict:
        """The trainer's new adapter, written to shared storage: every engine loads it now. Returns the
        wake's metrics (the shards' weights offloaded here, before the step's eval)."""
        with phases("wake"):
            metrics = self.fleet.turn_to_engines()
        with phases("sync"):
            self.fleet.engines.load_adapter(adapter)
        return metrics

    def settle(self, state) -> None:
        """Engines free and holding the trainer's adapter (for an eval): they are, between steps."""

    def rewind(self, state) -> None:
        """The step was abandoned before its update: its batch goes back to the sampler."""
        state.sampler.load_state_dict(self.drawn_from)

    def cancel(self) -> None:
        """Nothing runs between steps."""

    def reset(self) -> None:
        """Nothing is held between steps."""


class RolloutsAhead(Rollouts):
    """One-step-off: the next step's batch is generated in a thread while this step trains."""

    def __init__(self, fleet):
        super().__init__(fleet)
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="rollouts-ahead")
        self.cancelled = threading.Event()
        self.future: Future | None = None  # the batch of state.step + 1: (episodes, {"seconds", "version", "epoch"})
        self.before = None  # at take(): the sampler, the batch's record, its future (for a rewind)

    def take(self, step: int, state, phases, preemption) -> tuple[list, int, dict]:
        self.before = None
        with phases("generate"):  # the wait: the batch was (mostly) generated while the last step trained
            if self.future is None:  # the run's first step, or after a resume, a recovery or a rewind
                self._start(step, state)
            while True:
                try:
                    episodes, info = self.future.result(timeout=WAIT_POLL_S)
                    break
                except TimeoutError:
                    preemption.check()  # SIGTERM or a draining node: the step is abandoned here
        self.before = (state.sampler.state_dict(), state.ahead, self.future)
        state.sampler.record_outcomes(episodes)
        last = min(self.fleet.total_steps, self.fleet.cfg.trainer.stop_after_step or self.fleet.total_steps)
        state.ahead, self.future = None, None
        if step < self.fleet.total_steps:
            # the next batch, drawn now and sampled with the newest adapter: the trainer's before this update
            state.ahead = {"adapter_version": state.version, "sampler": state.sampler.state_dict()}
            if step < last:  # a run stopping here records the batch, and its resume generates it
                self._start(step + 1, state)
        # timing/generate is the wait for the batch; async/generate_s its generation, done mostly while the last step trained
        metrics = {"async/staleness": state.version - info["version"], "async/generate_s": info["seconds"]}
        return episodes, info["epoch"], {"seconds": info["seconds"], "metrics": metrics}

    def _start(self, step: int, state) -> None:
        """Draw batch `step` from where state.ahead says and generate it in the thread, with the adapter
        state.ahead names (the trainer's, when nothing is recorded)."""
        if state.ahead is None:
            state.ahead = {"adapter_version": state.version, "sampler": state.sampler.state_dict()}
        state.sampler.load_state_dict(state.ahead["sampler"])
        rows, epoch = state.sampler.next_batch()
        version = state.ahead["adapter_version"]
        adapter = version_ref(self.fleet.run_dir / "adapters", version)
        tasks = rollout_tasks(rows, step, self.fleet.cfg.generator.n_samples_per_prompt)
        self.cancelled.clear()
        self.future = self.thread.submit(self._generate, tasks, training_sampling(self.fleet.cfg, step), adapter,
                                         version, epoch)

    def _generate(self, tasks, sampling, adapter: AdapterRef | None, version: int, epoch: int):
        """In the thread: the batch's adapter into the engines (unless they hold it), then the episodes."""
        started = time.perf_counter()
        fleet = self.fleet
        if fleet.engines.version != version:
            fleet.engines.load_adapter(adapter)
        episodes = fleet.runner.run(tasks, sampling, version, between_turns=self._check,
                                    explore=fleet.cfg.generator.explore_revisits)
        return episodes, {"seconds": time.perf_counter() - started, "version": version, "epoch": epoch}

    def _check(self) -> None:
        if self.cancelled.is_set():
            raise Cancelled()

    def publish(self, adapter: AdapterRef, phases) -> dict:
        """Written to shared storage: the engines load it when the next batch starts."""
        return {}

    def settle(self, state) -> None:
        """Wait for the batch in flight (its failure, if any, is raised here), then the trainer's adapter
        into the engines."""
        if self.future is not None:
            self.future.result()
        if self.fleet.engines.version != state.version:
            self.fleet.engines.load_adapter(state.adapter)

    def rewind(self, state) -> None:
        """Back to the start of the abandoned step: the sampler where it was, the step's batch in
        flight again (kept if it was generated, else generated anew with the same adapter)."""
        if self.before is None:  # abandoned while waiting for its batch: that batch is the one in flight
            self.cancel()
            self.reset()
            return
        sampler, ahead, taken = self.before
        self.cancel()
        self.reset()
        state.sampler.load_state_dict(sampler)
        state.ahead, self.future = ahead, taken

    def cancel(self) -> None:
        """Stop the batch in flight at its next turn (an actor was lost, or the step abandoned)."""
        self.cancelled.set()

    def reset(self) -> None:
        """Wait for the thread to let go (a lost actor's calls fail; a cancelled batch stops at its next
        turn) and forget its batch: the next take starts the one state.ahead records."""
        if self.future is not None:
            try:
                self.future.result()
            except Exception:  # noqa: BLE001 - cancelled, or an actor lost: the batch is generated again
                pass
        self.future, self.before = None, None
