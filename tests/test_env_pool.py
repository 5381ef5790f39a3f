"""EnvPool: many episodes per call, isolated from each other, rejected ids change nothing."""
import numpy as np
import pytest

from actors.env_pool import EnvPool
from envs.expert import expert_actions
from envs.maze import INVALID_ACTION, MazeEnv


def test_batch_reset_and_step_with_one_bad_answer():
    pool = EnvPool("maze_2d/easy", cell_px=8, max_turns=15)
    ids = [f"ep{i}" for i in range(200)]
    obs = pool.reset(ids, seeds=list(range(200)))
    assert [o["episode_id"] for o in obs] == ids and obs[0]["image"].shape == (72, 72, 3)
    reference = MazeEnv(cell_px=8)
    plans = []
    for i in range(200):
        reference.reset(seed=i)
        plans.append(expert_actions(reference.maze, reference.agent, reference.target))
    answers = [f"<action>{p[0]}</action>" for p in plans]
    answers[7] = "\x00garbage" * 1000
    out = pool.step(ids, answers)
    assert out[7]["info"]["feedback"] == INVALID_ACTION and out[7]["info"]["agent"] == obs[7]["info"]["agent"]
    moved = [o for i, o in enumerate(out) if i != 7]
    assert all(o["info"]["agent"] != obs[i if i < 7 else i + 1]["info"]["agent"] for i, o in enumerate(moved))


def test_unknown_or_finished_ids_are_rejected_before_any_step():
    pool = EnvPool("maze_2d/easy", max_turns=2)
    pool.reset(["a", "b"], seeds=[0, 1])
    with pytest.raises(ValueError, match="unknown"):
        pool.step(["a", "zzz"], ["up", "up"])
    assert pool._envs["a"][1].turn == 0  # nothing half-applied
    pool.step(["a"], ["stop"])
    with pytest.raises(ValueError, match="finished"):
        pool.step(["a", "b"], ["up", "up"])
    assert pool.close(["a"]) == 1 and pool.size() == 1


def test_init_states_rebuild_episodes():
    pool = EnvPool("maze_2d/easy")
    env = MazeEnv()
    env.reset(seed=11)
    out = pool.reset(["x"], init_states=[env.get_state()])
    assert np.array_equal(out[0]["image"], env.render())


def test_a_users_environment_by_import_path():
    """EnvPool hosts a task it was never written for, named by import path; each result carries the
    state key the task defines, and the rows it reads are checked by the task."""
    from envs.registry import get_environment
    pool = EnvPool("tests.toy_task:CountTask", cell_px=8, max_turns=3)
    environment = pool.environment
    starts = pool.reset(["a", "b"], seeds=[0, 1], init_states=[{"count": 2}, {"count": 3}])
    assert starts[0]["image"].shape == (32, 32, 3) and starts[0]["image"].sum() == 2 * 16 * 3 * 255
    out = pool.step(["a", "b"], ["2", "seven"])
    assert [o["reward"] for o in out] == [1.0, 0.0] and out[0]["terminated"] and not out[1]["terminated"]
    assert out[1]["info"]["feedback"] == "Answer a number from 1 to 4." and [o["state_key"] for o in out] == [1, 1]
    assert get_environment("tests.toy_task:CountTask") is environment
    with pytest.raises(ValueError, match="not a subclass of envs.base.Environment"):
        get_environment("tests.toy_task:CountEnv")
    known = "maze_2d/easy, maze_2d/easy_marks, maze_2d/easy_trail, maze_2d/hard, maze_2d/hard_marks, maze_2d/hard_trail"
    with pytest.raises(ValueError, match=f"unknown environment 'maze_3d'.*{known}"):
        EnvPool("maze_3d")


def test_rows_are_checked_by_their_own_environment(tmp_path):
    from envs.rows import load_rows
    path = tmp_path / "rows.jsonl"
    path.write_text('{"seed": 1, "env_id": "tests.toy_task:CountTask", "count": 9}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:1 is not a tests.toy_task:CountTask row \(count must be 1 to 4\)"):
        load_rows(path)
    path.write_text('{"seed": 1, "env_id": "tests.toy_task:CountTask", "count": 4}\n')
    assert load_rows(path) == [{"seed": 1, "env_id": "tests.toy_task:CountTask", "count": 4}]
