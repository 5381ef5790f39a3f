"""SIGTERM, as a spot reclaim, a node drain or a pod deletion sends it before SIGKILL, becomes a
checkpoint and an exit that says so.

On the signal, a step that has not reached its update is abandoned at its next turn or phase (the
batch it drew goes back to the sampler, so the rerun draws it again); a step that has finishes,
without its eval and export. The run's state is then saved and the driver exits with PREEMPTED. A
watchdog bounds all of it: `trainer.preemption_timeout_s` after the signal the process ends
whatever it is doing, saying which checkpoint is durable, before the platform's SIGKILL would.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

PREEMPTED = 75  # EX_TEMPFAIL: stopped on SIGTERM with the state saved; the same command resumes
ABANDONABLE = ("sample", "wake", "generate", "advantages", "items", "sleep", "ref")  # before the update


class Preempted(Exception):
    """SIGTERM arrived before the step's update: the step is abandoned."""


class Preemption:
    def __init__(self, timeout_s: float, durable_step):
        self.timeout_s, self.durable_step = timeout_s, durable_step  # durable_step(): the newest saved step
        self.requested: float | None = None  # when SIGTERM arrived (time.monotonic)
        self.committed = False  # the current step has begun its update: it finishes

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
        """Raise Preempted when SIGTERM came and the step can still be abandoned (between turns, too)."""
        if self.requested is not None and not self.committed:
            raise Preempted()
