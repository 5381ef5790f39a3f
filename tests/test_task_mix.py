"""Two tasks in one run (envs/mix.py): the mix's dataset is its parts' datasets, each episode is its
row's task in the env pool and in the prompt, and the evaluation reports each task."""
import json

import pytest

from actors.env_pool import EnvPool
from envs.registry import get_environment
from inference.requests import GenResult, Sampling
from rl.evaluate import evaluate
from rl.inputs import InputError, load_datasets, make_prompters, read_rows
from rl.metrics import eval_metrics
from rl.rollout import RolloutRunner, rollout_tasks
from settings.load import load_config
from telemetry.curve import summary_line
from vlm.processor import load_processor

MAZE, SLIDING = "maze_2d/easy", "sliding_block/easy"
MIX = f"{MAZE}+{SLIDING}"


def config(tmp_path, env_class, eval_size, train_size=16):
    return load_config(None, [f"environment.env_class={env_class}", f"data.eval_size={eval_size}",
                              f"data.train_size={train_size}", f"data.dataset_dir={tmp_path / env_class.replace('/', '_')}",
                              f"trainer.run_dir={tmp_path / 'run'}", "trainer.train_batch_size=4"])


def test_the_mixs_dataset_is_its_parts_datasets(tmp_path):
    train, evals = load_datasets(config(tmp_path, MIX, eval_size=8))
    assert [r["env_id"] for r in train] == [MAZE, SLIDING] * 8  # every batch holds both
    for task in (MAZE, SLIDING):  # each part is evaluated on the rows a run of that task alone is
        _, alone = load_datasets(config(tmp_path, task, eval_size=4, train_size=8))
        assert [r for r in evals if r["env_id"] == task] == alone
        assert [r for r in train if r["env_id"] == task] == load_datasets(config(tmp_path, task, 4, 8))[0]
    manifest = json.loads((tmp_path / MIX.replace("/", "_") / "manifest.json").read_text())
    assert manifest["env_id"] == MIX and list(manifest["parts"]) == [MAZE, SLIDING]
    assert load_datasets(config(tmp_path, MIX, eval_size=8)) == (train, evals)  # the written folder checks out
    with pytest.raises(InputError, match="data.eval_size=8 \\(the config has 6\\)"):
        load_datasets(config(tmp_path, MIX, eval_size=6))


def test_a_mix_reads_its_parts_rows_and_refuses_others(tmp_path):
    hard = get_environment("maze_2d/hard").make_rows(0, 1, 49)
    (tmp_path / "hard.jsonl").write_text(json.dumps(hard[0]) + "\n")
    with pytest.raises(InputError, match="maze_2d/hard rows but environment.env_class is maze_2d/easy\\+"):
        read_rows(tmp_path / "hard.jsonl", "data.eval_set", MIX)
    rows = get_environment(MIX).make_rows(0, 4, 20)
    (tmp_path / "mix.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_rows(tmp_path / "mix.jsonl", "data.eval_set", MIX) == rows


def test_the_env_pool_plays_each_episode_as_its_rows_task():
    mix = get_environment(MIX)
    rows = mix.make_rows(0, 4, 20)
    pool = EnvPool(MIX, cell_px=16, max_turns=20)
    tasks = rollout_tasks(rows, 0, 1)
    starts = pool.reset([t.episode_id for t in tasks], [t.seed for t in tasks], [t.init_state for t in tasks],
                        [t.env_id for t in tasks])
    assert [s["image"].shape[:2] for s in starts] == [get_environment(r["env_id"]).picture_size(16) for r in rows]
    # each row's expert, played on a shadow env of its task, solves it through the pool
    shadows = []
    for row in rows:
        shadows.append(get_environment(row["env_id"]).make_env(16, 20))
        shadows[-1].reset(options={"init_state": get_environment(row["env_id"]).init_state(row)})
    live, rewards = list(range(len(rows))), [0.0] * len(rows)
    while live:
        answers = [get_environment(rows[i]["env_id"]).expert_answer(shadows[i]) for i in live]
        out = pool.step([tasks[i].episode_id for i in live], answers)
        for i, answer, o in zip(live, answers, out):
            shadows[i].step(answer)
            rewards[i] += o["reward"]
        live = [i for i, o in zip(live, out) if not (o["terminated"] or o["truncated"])]
    assert rewards == [1.0] * len(rows)
    with pytest.raises(ValueError, match="this pool hosts maze_2d/easy, sliding_block/easy"):
        pool.reset(["x"], env_ids=["maze_2d/hard"])
    with pytest.raises(ValueError, match="this pool hosts"):
        pool.reset(["y"])  # a mix's pool has no env of its own: each episode names its task


def test_each_episode_is_prompted_as_its_task_and_the_eval_reports_each_task():
    cfg = load_config(None, [f"environment.env_class={MIX}"])
    prompters = make_prompters(load_processor("assets/maze-vl-base"), cfg)
    assert {k: v.n_image for k, v in prompters.items()} == {MAZE: 81, SLIDING: 45}  # 144x144 and 80x144 pictures
    asked = []

    def stop_at_once(requests, sampling, version):  # a sampling client whose every answer is stop
        asked.extend(requests)
        return [GenResult([1], [0.0], "<action>stop</action>", "stop", version, len(r.prompt_ids)) for r in requests]

    rows = get_environment(MIX).make_rows(0, 4, 20)
    runner = RolloutRunner(stop_at_once, EnvPool(MIX, 16, 20), prompters, 20, 4096)
    report = evaluate(runner, rows, Sampling(max_new_tokens=8, temperature=0.0), 0)
    pad = prompters[MAZE].image_token_id
    assert [r.prompt_ids.count(pad) for r in asked] == [81, 45, 81, 45]
    assert [r.images[0].shape[:2] for r in asked] == [(144, 144), (80, 144)] * 2
    assert asked[1].prompt_ids[:len(prompters[SLIDING].head)] == prompters[SLIDING].head  # its own instruction
    assert report.by_task == {t: {"solve_rate": 0.0, "solved": 0, "total": 2, "oracle_ceiling": 1.0,
                                  "env_ceiling": get_environment(t).env_ceiling(20)} for t in (MAZE, SLIDING)}
    assert report.env_ceiling is None and [r["env_id"] for r in report.per_row] == [MAZE, SLIDING] * 2
    assert f"{MAZE} 0.0% (0/2), {SLIDING} 0.0% (0/2)" in report.line()
    metrics = eval_metrics(report)
    assert metrics[f"eval/task/{MAZE}/avg_score"] == 0.0 and f"eval/task/{SLIDING}/avg_score" in metrics
    history = [{"step": 0, **metrics}, {"step": 5, **metrics, f"eval/task/{MAZE}/avg_score": 0.5}]
    assert f"{MAZE}: baseline 0.0% -> final 50.0% (step 5)" in summary_line(history)
    with pytest.raises(ValueError, match="tasks of maze_2d/hard, but this runner prompts for"):
        runner.run(rollout_tasks(get_environment("maze_2d/hard").make_rows(0, 1, 49), 0, 1), Sampling(), 0)


def test_a_mix_of_one_task_twice_or_of_an_unknown_task_is_a_config_error():
    """Checked where every entry point checks the task, before anything starts (rl.inputs.check_environment)."""
    from rl.inputs import check_environment
    from settings import ConfigError
    with pytest.raises(ConfigError, match="environment.env_class.*two or more different environments"):
        check_environment(load_config(None, [f"environment.env_class={MAZE}+{MAZE}"]))
    with pytest.raises(ConfigError, match="environment.env_class.*unknown environment 'maze_9d'"):
        check_environment(load_config(None, [f"environment.env_class={MAZE}+maze_9d"]))
    # starts moved along a route need every task to have one: the blocks' part would ignore the key
    for key in ("junction_start_share", "detour_start_share"):
        with pytest.raises(ConfigError, match=f"data.{key}.*{SLIDING} has none; set data.{key}=0"):
            check_environment(load_config(None, [f"environment.env_class={MAZE}+{SLIDING}", f"data.{key}=0.25"]))
        check_environment(load_config(None, [f"environment.env_class={MAZE}", f"data.{key}=0.25"]))
