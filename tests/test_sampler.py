"""rl/sampler.py: the seeded epoch order, replay of mazes whose group came back mixed, and a
checkpoint round trip that resumes the same batches (the queue included)."""
import json
from types import SimpleNamespace

import numpy as np

from rl.sampler import MAX_REPLAYS, PromptSampler

ROWS = [{"seed": i} for i in range(40)]


def episodes(solved_per_group: list[int], samples: int = 4) -> list:
    """`samples` episodes a group, the first `solved_per_group[g]` of group g solved."""
    return [SimpleNamespace(group=g, solved=k < n) for g, n in enumerate(solved_per_group) for k in range(samples)]


def seeds(rows: list[dict]) -> list[int]:
    return [r["seed"] for r in rows]


def test_without_replay_each_epoch_is_one_seeded_permutation_in_whole_batches():
    s = PromptSampler(ROWS, 6, seed=3)
    epoch0 = [seeds(s.next_batch()[0]) for _ in range(s.steps_per_epoch)]
    rows, epoch = s.next_batch()
    order = np.random.default_rng([3, 0]).permutation(40)
    assert sum(epoch0, []) == [int(i) for i in order[:36]]  # 4 left over: the partial batch is dropped
    assert epoch == 1 and seeds(rows) == [int(i) for i in np.random.default_rng([3, 1]).permutation(40)[:6]]
    s.record_outcomes(episodes([2, 0, 4, 1, 3, 2]))  # replay off: nothing is queued
    assert s.queue == [] and s.replayed == 0


def test_mixed_groups_are_replayed_fewest_solved_first_and_no_fresh_maze_is_skipped():
    s = PromptSampler(ROWS, 4, seed=0, replay_share=0.5)  # up to 2 replays a batch
    first, _ = s.next_batch()
    s.record_outcomes(episodes([4, 3, 0, 1]))  # all solved, mixed, all failed, mixed
    assert [q["row"] for q in s.queue] == [first[1]["seed"], first[3]["seed"]]
    second, _ = s.next_batch()
    assert seeds(second[:2]) == [first[3]["seed"], first[1]["seed"]]  # 1 of 4 solved before 3 of 4
    assert s.replayed == 2 and s.queue == []
    fresh = seeds(first) + seeds(second[2:])
    assert fresh == [int(i) for i in np.random.default_rng([0, 0]).permutation(40)[:6]]


def test_a_maze_is_replayed_at_most_max_replays_times():
    s = PromptSampler(ROWS, 2, seed=0, replay_share=0.5)
    rows, _ = s.next_batch()
    hard, times = rows[0]["seed"], 0
    s.record_outcomes(episodes([1, 4]))
    for _ in range(MAX_REPLAYS + 2):
        rows, _ = s.next_batch()
        times += rows[0]["seed"] == hard
        s.record_outcomes(episodes([1, 4]) if rows[0]["seed"] == hard else episodes([4, 4]))
    assert times == MAX_REPLAYS and s.queue == []


def test_a_checkpointed_sampler_resumes_the_same_batches_and_queue():
    a = PromptSampler(ROWS, 4, seed=5, replay_share=0.5)
    for k in range(7):
        a.next_batch()
        a.record_outcomes(episodes([k % 3, 1, 4, 2]))
    saved = json.loads(json.dumps(a.state_dict()))  # as trainer_state.json holds it
    b = PromptSampler(ROWS, 4, seed=5, replay_share=0.5)
    b.load_state_dict(saved)
    for k in range(12):  # across the epoch boundary
        ra, rb = a.next_batch(), b.next_batch()
        assert ra == rb
        for s in (a, b):
            s.record_outcomes(episodes([1, k % 4, 0, 3]))
    assert a.state_dict() == b.state_dict()


def test_a_checkpoint_from_before_replay_resumes_at_its_batch():
    old = PromptSampler(ROWS, 4, seed=1)
    for _ in range(3):
        old.next_batch()
    s = PromptSampler(ROWS, 4, seed=1)
    s.load_state_dict({"epoch": 0, "cursor": 3, "seed": 1, "batch_size": 4, "rows": 40})
    assert s.next_batch() == old.next_batch()
