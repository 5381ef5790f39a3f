"""SIGTERM, as a spot reclaim, a node drain or a pod deletion sends it before SIGKILL, becomes a
checkpoint and an exit that says so.

On the signal, a step that has not reached its update is abandoned at its next turn or phase (the
batch it drew goes back to the sampler, so the rerun draws it again); a step that has finishes,
without its eval and export. The run's state is then saved and the driver exits with PREEMPTED. A
watchdog bounds all of it: `trainer.preemption_timeout_s` after the signal the process ends
whatever it is doing, saying which checkpoint is durable, before the platform's SIGKILL would.

A worker node about to go asks for a checkpoint instead (controller/drain.py, its pod's preStop
hook): the step is abandoned or finished the same way, the state saved, the node answered, and the
run goes on; the node's loss then restores that checkpoint.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

PREEMPTED = 75  # EX_TEMPFAIL: stopped on SIGTERM with the state saved; the same command resumes
ABANDONABLE = ("sample", "wake", "generate", "advantages", "items", "sleep", "ref")  # before the update
DRAIN_POLL_S = 0.5  # how often the driver looks for a node asking to be drained (a call to Ray's KV store)


class Preempted(Exception):
    """SIGTERM arrived before the step's update: the step is abandoned."""


class Preemption:
    def __init__(self, timeout_s: float, durable_step, drains=None):
        self.timeout_s, self.durable_step = timeout_s, durable_step  # durable_step(): the newest saved step
        self.requested: float | None = None  # when SIGTERM arrived (time.monotonic)
        self.committed = False  # the current step has begun its update: it finishes
        self.drains = drains  # () -> the nodes asking for a checkpoint (controller.drain.asked); None: not asked
        self.draining: list[str] = []  # those nodes, as last seen
        self._polled = float("-inf")

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.requested is not None:
            return
        self.requested = time.monotonic()
        print(f"SIGTERM: preempted; saving the run's state and exiting within {self.timeout_s:g}s "
              f"(trainer.preemption_timeout_s)", file=sys.stderr, flush=True)
        threading.Thread(target=self._watchdog, daemon=True).start()

    def _watchdog(self) -> None:
        time.sleep(self.timeout_s)
        print(f"SIGTERM: no exit within trainer.preemption_timeout_s={self.timeout_s:g}s; stopping now. The "
              f"last durable checkpoint is step {self.durable_step()}: run the same command to resume from it",
              file=sys.stderr, flush=True)
        os._exit(PREEMPTED)

    def step_started(self) -> None:
        self.committed = False

    def at_phase(self, phase: str) -> None:
        """Called as each phase of a step starts: abandon the step while nothing has been updated."""
        if phase not in ABANDONABLE:
            self.committed = True
        self.check()

    def check(self) -> None:
        """Raise Preempted when SIGTERM came, or a node asks to be drained, and the step can still be
        abandoned (between turns, too)."""
        if self.drains is not None and time.monotonic() - self._polled >= DRAIN_POLL_S:
            self._polled = time.monotonic()
            self.draining = self.drains()
        if (self.requested is not None or self.draining) and not self.committed:
            raise Preempted()

    @property
    def save_now(self) -> bool:
        """The step's end saves the state whatever the interval (and skips eval and export)."""
        return self.requested is not None or bool(self.draining)
