"""What one training step changes, owned in one place: the step reached, the adapter the engines
hold, the data position and the best adapter so far by the validation set. Two things write it: a
finished step (driver.grpo_step marks the step and adapter, and at an eval the best; the sampler
moves as it hands out batches) and a restore from a checkpoint (controller.fleet.Fleet.restore),
whose snapshot it is (the best adapter's record is its export's selection.json). With one-step-off
training it also holds the batch being generated for the next step (`ahead`), so that a checkpoint
records what is in flight and a resume generates the same batch with the same adapter."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rl.sampler import PromptSampler
from storage.adapters import AdapterRef, version_ref


@dataclass
class RunState:
    step: int
    adapter: AdapterRef | None   # None: the engines serve the base model (version 0)
    sampler: PromptSampler
    best: dict | None = None     # {"step", "validation", "eval"} of the adapter exported as <export_path>/best
    trackers: dict | None = None  # {tracker: run id} (MLflow, W&B): a resumed run continues the same runs
    # one-step-off (controller/rollouts.py): the batch of step+1, drawn and being generated:
    # {"adapter_version": what it is sampled with, "sampler": the dataloader's position before it was drawn}
    ahead: dict | None = None
    # the metrics line of the step a checkpoint saved, kept with it (telemetry.run_log.RunLog.rewind)
    saved_line: dict | None = None

    @property
    def version(self) -> int:
        return self.adapter.version if self.adapter else 0

    def snapshot(self, total_steps: int, config_yaml: str, line: dict | None = None) -> dict:
        """The trainer_state.json of a checkpoint (this class is the one reader and writer of its fields);
        `line`: the step's metrics line so far, when the save comes before it is logged."""
        snap = {"global_step": self.step, "adapter_version": self.version, "total_steps": total_steps,
                "sampler": self.sampler.state_dict(), "config": config_yaml, "trackers": self.trackers or {}}
        if line is not None:
            snap["metrics_line"] = line
        if self.ahead is not None:  # the position before the batch in flight: a resume draws it again
            snap |= {"sampler": self.ahead["sampler"], "rollouts_ahead": {"adapter_version": self.ahead["adapter_version"]}}
        return snap

    def in_flight_note(self) -> str:
        """What a resume generates again, for its message ("" when nothing was in flight)."""
        if self.ahead is None:
            return ""
        return f"; step {self.step + 1}'s rollouts again with adapter v{self.rollout_version}"

    @property
    def rollout_version(self) -> int:
        """The adapter version the next rollouts are sampled with."""
        return self.ahead["adapter_version"] if self.ahead is not None else self.version

    @staticmethod
    def adapter_of(trainer_state: dict, adapters_dir: Path) -> AdapterRef | None:
        """The adapter version a checkpoint's engines held, in the run's adapters folder (None: the base)."""
        return version_ref(adapters_dir, int(trainer_state["adapter_version"]))

    def restore(self, trainer_state: dict, adapter: AdapterRef | None, best: dict | None = None) -> None:
        """`best`: the selection.json of the adapter exported as <export_path>/best, if any. The export,
        not the checkpoint, records the choice: it can be newer than the checkpoint (chosen after it,
        then those steps were lost to a fault), and it stays the run's choice, so later adapters are
        compared with the one actually exported."""
        self.sampler.load_state_dict(trainer_state["sampler"])
        self.step, self.adapter, self.best = int(trainer_state["global_step"]), adapter, best
        self.trackers = trainer_state.get("trackers") or self.trackers  # none in checkpoints from before they were kept
        self.saved_line = trainer_state.get("metrics_line")
        ahead = trainer_state.get("rollouts_ahead")
        self.ahead = None if ahead is None else {"adapter_version": int(ahead["adapter_version"]),
                                                 "sampler": trainer_state["sampler"]}

    def reset(self) -> None:
        """Back to the start: step 0, the base model, the first batch of epoch 0, nothing queued for replay."""
        self.step, self.adapter, self.best, self.ahead, self.saved_line = 0, None, None, None, None
        self.sampler.reset()
