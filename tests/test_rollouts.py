"""controller/rollouts.py's one-step-off bookkeeping, with an in-process fleet: which batch each step
takes, which adapter each batch is sampled with, and what an abandoned step puts back."""
import threading

from controller.rollouts import RolloutsAhead
from envs.dataset import make_rows
from rl.rollout import Episode
from rl.sampler import PromptSampler
from rl.state import RunState
from settings import load_config
from storage.adapters import AdapterRef
from telemetry.timing import Phases

ROWS, _ = make_rows("maze_2d/easy", 0, 12, max_turns=15, solvable_only=False)


class Engines:
    def __init__(self):
        self.version, self.loads = 0, []

    def load_adapter(self, ref):
        assert ref.version >= self.version, "an engine never goes back to an older adapter"
        self.version = ref.version
        self.loads.append(ref.version)


class Runner:
    """Plays each task as one episode; a batch can be held until released (a generation in flight)."""

    def __init__(self):
        self.batches, self.hold = [], None

    def run(self, tasks, sampling, version, between_turns=None, explore=0.0):
        assert explore == 0.0  # the config's generator.explore_revisits
        self.batches.append((tasks[0].seed, version))
        while self.hold is not None and not self.hold.wait(0.01):
            between_turns()
        return [Episode(t.episode_id, t.group, t.seed, adapter_version=version) for t in tasks]


class Fleet:
    def __init__(self, tmp_path, total_steps=4):
        self.cfg = load_config(None, ["generator.n_samples_per_prompt=2"])
        self.total_steps, self.run_dir = total_steps, tmp_path
        self.engines, self.runner = Engines(), Runner()


class NoSignal:
    def check(self):
        pass


class Abandon(Exception):
    pass


def train(state, step):
    """What the driver does after the update: the step and its adapter marked."""
    state.step, state.adapter = step, AdapterRef(f"adapters/v{step}", step)


def batches(n):
    """The first row's seed of each of the first n batches, in the dataloader's order."""
    sampler = PromptSampler(ROWS, 2, 0)
    return [sampler.next_batch()[0][0]["seed"] for _ in range(n)]


def test_each_step_trains_on_the_batch_generated_beside_the_last_one_adapter_behind(tmp_path):
    fleet, state = Fleet(tmp_path), RunState(0, None, PromptSampler(ROWS, 2, 0))
    ahead = RolloutsAhead(fleet)
    for step in range(1, 5):
        episodes, _, info = ahead.take(step, state, Phases(), NoSignal())
        assert {e.adapter_version for e in episodes} == {max(step - 2, 0)}
        assert info["metrics"]["async/staleness"] == (0 if step == 1 else 1)
        train(state, step)
    # the synchronous order of batches; batch k+1 starts with v(k-1), as step k begins
    assert fleet.runner.batches == list(zip(batches(4), [0, 0, 1, 2]))
    assert state.ahead is None and ahead.future is None  # nothing is drawn past the last step


def test_an_abandoned_step_takes_the_same_batch_again_and_draws_the_same_next_one(tmp_path):
    """Abandoned after taking its batch: the rerun gets that batch without generating it again, and
    starts the next batch an uninterrupted run started. Abandoned while waiting for its batch: that
    batch is cancelled and generated again with the same adapter."""
    fleet, state = Fleet(tmp_path), RunState(0, None, PromptSampler(ROWS, 2, 0))
    ahead = RolloutsAhead(fleet)
    ahead.take(1, state, Phases(), NoSignal())
    train(state, 1)
    taken, _, _ = ahead.take(2, state, Phases(), NoSignal())  # batch 2 (v0); batch 3 starts with v1
    ahead.future.result()
    after = (state.sampler.state_dict(), dict(state.ahead))
    ahead.rewind(state)  # a SIGTERM during step 2's reference scoring
    assert state.ahead["adapter_version"] == 0  # batch 2's record again
    again, _, _ = ahead.take(2, state, Phases(), NoSignal())
    ahead.future.result()
    assert again is taken and (state.sampler.state_dict(), state.ahead) == after
    assert fleet.runner.batches == list(zip(batches(3), [0, 0, 1])) + [(batches(3)[2], 1)]

    train(state, 2)
    fleet.runner.hold = threading.Event()  # batch 4, started by step 3, is still generating when step 4 begins
    ahead.take(3, state, Phases(), NoSignal())

    class SigtermWhileWaiting:
        def check(self):
            raise Abandon()
    try:
        ahead.take(4, state, Phases(), SigtermWhileWaiting())
    except Abandon:
        ahead.rewind(state)  # cancelled at its next turn
    assert ahead.future is None and state.ahead["adapter_version"] == 2
    fleet.runner.hold = None
    episodes, _, _ = ahead.take(4, state, Phases(), NoSignal())
    assert {e.adapter_version for e in episodes} == {2} and fleet.runner.batches[-2:] == [(batches(4)[3], 2)] * 2
    assert fleet.engines.loads == [1, 2]  # never back to an older adapter
