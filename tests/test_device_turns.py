"""Engines and policy shards that share a device take turns through a whole GRPO step (driver.grpo_step,
the real controller/fleet.py and controller/rollouts.py): the engines never generate while the shards'
weights are on the device, and the shards never bring their weights back while the engines are awake.
Either overlap puts the engines' cache beside a resident shard: on one H100 the 8B step's eval ran
that way and the card peaked at 78.8 of its 79.6 GiB.

The actors are stand-ins that keep one ledger of the device (on the CPU nothing moves, so only the
order of the calls can be checked, and that is what this checks)."""
from types import SimpleNamespace

import ray

import driver
from controller.fleet import Fleet
from envs.dataset import make_rows
from rl.rollout import Episode, Turn
from rl.sampler import PromptSampler
from rl.state import RunState
from settings import load_config

ROWS, _ = make_rows("maze_2d/easy", 0, 8, max_turns=15, solvable_only=False)


class Device:
    """Who holds the device: the engines (awake) and/or the shards' weights (resident)."""

    def __init__(self):
        self.engines_awake, self.weights_resident, self.overlaps = True, True, []

    def overlap(self, what: str) -> None:
        if self.engines_awake and self.weights_resident:
            self.overlaps.append(what)


class Engines:
    def __init__(self, device):
        self.device, self.version = device, 0

    def wake_up(self):
        self.device.engines_awake = True
        self.device.overlap("an engine woke beside the shards' weights")

    def sleep(self):
        self.device.engines_awake = False

    def load_adapter(self, ref):
        self.version = ref.version

    def status(self):
        return [{"last_adapter_load_s": 0.0}]


class Trainer:
    """The shards: offload() and reload() as FSDPPolicyShard's; every call that needs the weights brings
    them back by itself (actors/policy_shard.py's @resident), wherever the engines are."""

    def __init__(self, device):
        self.device = device

    def offload(self):
        moved = 16.0 if self.device.weights_resident else 0.0
        self.device.weights_resident = False
        return moved

    def reload(self):
        self.device.weights_resident = True
        self.device.overlap("the shards' weights came back beside awake engines")

    def _resident(self, what):
        if not self.device.weights_resident:
            self.reload()
        self.device.overlap(what)

    def share(self, items):
        return {1: [items]}

    def reference_logprobs(self, shares, temperature, micro_batch):
        self._resident("reference log-probs")

    def wait(self, refs):
        pass

    def train(self, shares, algo, temperature, micro_batch, epochs, ref_logprobs):
        self._resident("train")
        return {"loss": 0.0}

    def save_adapter(self, folder):
        self._resident("save_adapter")  # the real one writes the folder; nothing here reads it
        return folder

    def state_dict(self):
        self._resident("state_dict")
        return {}


class Runner:
    """One turn an episode; the first of each group solves it (so every group has an advantage)."""
    max_turns = 15

    def __init__(self, device):
        self.device, self.generated = device, 0

    def run(self, tasks, sampling, version, between_turns=None, explore=0.0):
        assert self.device.engines_awake, "generating on sleeping engines"
        if self.device.weights_resident:
            self.device.overlaps.append("the engines generated beside the shards' weights")
        self.generated += len(tasks)
        return [Episode(t.episode_id, t.group, t.seed, reward=float(i % 2 == 0), stop_reason="stop",
                        turns=[Turn([1, 2, 3], [4, 5], [-0.1, -0.2], [], "up", state=t.seed)])
                for i, t in enumerate(tasks)]


class NoSignal:
    save_now = False

    def at_phase(self, phase):
        pass

    def check(self):
        pass


def test_engines_and_shards_sharing_a_device_never_hold_it_at_once(tmp_path, monkeypatch):
    cfg = load_config(None, ["trainer.train_batch_size=2", "trainer.policy_mini_batch_size=2", "generator.n_samples_per_prompt=2",
                             "trainer.eval_interval=2", "trainer.ckpt_interval=2", "trainer.hf_save_interval=100",
                             f"trainer.run_dir={tmp_path}"])
    fleet = Fleet(cfg, total_steps=4, run_dir=tmp_path, device="cpu", prompters={})
    assert fleet.takes_turns  # the default: colocate_all with sleeping engines
    device = Device()  # as after start-up: the shards loaded, the engines awake
    fleet.engines, fleet.trainer, fleet.runner = Engines(device), Trainer(device), Runner(device)
    fleet.actors = SimpleNamespace(checkpointer=SimpleNamespace(
        save=SimpleNamespace(remote=lambda *args: {"seconds": 0.1, "bytes": 1})))
    monkeypatch.setattr(ray, "get", lambda ref, timeout=None: ref)  # the stand-in checkpointer answers at once
    run = driver.Run(cfg, tmp_path, eval_rows=ROWS[:2], validation_rows=[], total_steps=4, config_yaml="")
    state = RunState(0, None, PromptSampler(ROWS, 2, 0))

    driver.evaluate_policy(run, fleet, state)  # eval before training, as the driver starts
    metrics = [driver.grpo_step(step, state, fleet, run, NoSignal()) for step in (1, 2)]

    assert device.overlaps == []
    # the step's update ran (so its turn was taken), its eval and checkpoint came at step 2, and the
    # weights that left the device for the step's eval are counted in the step's metrics
    assert fleet.runner.generated == 2 + 4 + 4 + 2
    assert metrics[1]["ckpt/failed"] == 0.0 and "timing/eval" in metrics[1]
    assert all(m["memory/trainer_offloaded_gib"] == 16.0 for m in metrics)
