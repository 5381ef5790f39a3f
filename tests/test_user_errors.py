"""Every user error the driver can meet ends with exit status 2 and one line naming the input,
what is wrong and what to do: no traceback, nothing written, no network."""
import json
import re
import subprocess
from pathlib import Path

import pytest

import driver
from envs.dataset import make_rows
from envs.rows import rows_bytes


@pytest.fixture
def files(tmp_path):
    easy, _ = make_rows("maze_2d/easy", 5_000_000, 2, 20, True)
    hard, _ = make_rows("maze_2d/hard", 5_000_000, 2, 30, True)
    f = {"garbage": "this is not json\n", "empty": "", "hard": rows_bytes(hard).decode(),
         "mixed": rows_bytes(easy + hard).decode(),
         "no_maze": "".join(json.dumps({k: v for k, v in r.items() if k != "maze"}) + "\n" for r in easy)}
    for name, text in f.items():
        (tmp_path / f"{name}.jsonl").write_text(text)
    (tmp_path / "empty_adapter").mkdir()
    (tmp_path / "not_a_model").mkdir()
    return tmp_path


# (arguments, words the one-line message must hold); {t} is the test's folder
CASES = [
    (["trainer.policy.model.path=assets/no-such-model"], ["assets/no-such-model", "does not exist"]),
    (["--eval-only", "trainer.policy.model.path=./nowhere/model"], ["./nowhere/model", "does not exist"]),
    (["--eval-only", "trainer.policy.model.path={t}/not_a_model"], ["not_a_model", "config.json"]),
    (["--eval-only", "--eval-set", "{t}/missing.jsonl"], ["--eval-set", "missing.jsonl", "does not exist"]),
    (["--eval-only", "--eval-set", "{t}/garbage.jsonl"], ["--eval-set", "garbage.jsonl", "not a task row"]),
    (["--eval-only", "--eval-set", "{t}/no_maze.jsonl"], ["--eval-set", "no_maze.jsonl", "maze_2d/easy row (no maze)"]),
    (["data.eval_set={t}/hard.jsonl"], ["data.eval_set", "maze_2d/hard", "environment.env_class"]),
    (["--eval-only", "--eval-set", "{t}/empty.jsonl"], ["--eval-set", "empty.jsonl", "no rows"]),
    (["--eval-only", "--adapter", "{t}/no_adapter"], ["--adapter", "no_adapter", "not a folder"]),
    (["--eval-only", "--adapter", "{t}/empty_adapter"], ["--adapter", "adapter_config.json"]),
    (["data.eval_set={t}/missing.jsonl"], ["data.eval_set", "does not exist"]),
    (["trainer.max_prompt_length=50"], ["trainer.max_prompt_length", "raise it"]),
    (["trainer.train_batch_sise=8"], ["train_batch_sise", "did you mean 'trainer.train_batch_size'"]),
    (["trainer.critic.model.path=x"], ["trainer.critic", "does not support"]),
    (["trainer.resume_mode=from_path", "trainer.resume_path={t}/ckpts/step9"], ["resume_path", "global_step_N"]),
    (["trainer.logger=neptune"], ["trainer.logger", "tensorboard, console, mlflow, wandb"]),
    (["trainer.policy.model.lora.init_from={t}/stage1"], ["lora.init_from", "stage1", "does not exist",
                                                        "train the stage it names first"]),
    (["trainer.policy.model.lora.init_from={t}/empty_adapter"], ["lora.init_from", "adapter_config.json"]),
]


@pytest.mark.parametrize("args, words", CASES, ids=[" ".join(c[0])[:60] for c in CASES])
def test_user_error(files, args, words, capsys, monkeypatch):
    import huggingface_hub

    def no_network(*a, **k):
        raise AssertionError("a local-looking path must not be looked up on the Hugging Face Hub")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    run = files / "run"
    argv = [a.format(t=files) for a in args] + [f"trainer.run_dir={run}", f"data.dataset_dir={run}/data"]
    assert driver.main(argv) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.err + out.out, out.err
    for w in words:
        assert w.format(t=files) in lines[0], (w, lines[0])
    assert not run.exists()  # nothing written: no run folder, no dataset


def old_dataset_folder(tmp_path, *validation):
    """A dataset folder written earlier: 8 train and 4 eval mazes, 20 turns, and the validation split given."""
    from envs.dataset import write_dataset
    old = tmp_path / "old_data"
    write_dataset(old, "maze_2d/easy", 8, 4, 0, 1_000_000, 20, True, *validation)
    return old


def run_on(old, run, *overrides):
    """The driver on that folder, with the settings it was written under unless overridden."""
    return driver.main([f"data.dataset_dir={old}", f"trainer.run_dir={run}", "trainer.train_batch_size=8",
                        "data.eval_size=4", "generator.max_turns=20", *overrides])


def test_a_dataset_folder_without_the_validation_split_names_the_fix(tmp_path, capsys):
    old = old_dataset_folder(tmp_path)  # written before validation sets: train and eval only
    run = tmp_path / "run"
    assert run_on(old, run, "data.train_size=8", "data.validation_size=8") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(old) in err[0] and "without a validation split" in err[0]
    assert "data.validation_size=0" in err[0] and not run.exists()


def test_a_dataset_folder_written_under_other_settings_is_not_trained_on(tmp_path, capsys):
    """A folder from an earlier default (other train size) stops the run with the setting that differs."""
    old = old_dataset_folder(tmp_path)
    manifest = (old / "manifest.json").read_text()
    run = tmp_path / "run"
    assert run_on(old, run, "data.train_size=16") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(old) in err[0] and "data.train_size=8 (the config has 16)" in err[0], err
    assert "data.eval_size" not in err[0] and not run.exists()
    assert (old / "manifest.json").read_text() == manifest  # the folder is left as it was
    assert run_on(old, run, "data.train_size=8", "data.junction_start_share=0.5") == 2
    err = capsys.readouterr().err
    assert "data.junction_start_share=0.0 (the config has 0.5)" in err and not run.exists()


def test_a_validation_split_of_another_size_is_not_used(tmp_path, capsys):
    old = old_dataset_folder(tmp_path, 4, 2_000_000)
    run = tmp_path / "run"
    assert run_on(old, run, "data.train_size=8", "data.validation_size=8") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "data.validation_size=4 (the config has 8)" in err[0], err
    assert not run.exists()


def test_an_eval_set_of_several_tasks_is_evaluated_task_by_task(files, tmp_path, capsys):
    run = tmp_path / "run"
    assert driver.main(["--eval-only", "--eval-set", str(files / "mixed.jsonl"), f"trainer.run_dir={run}",
                        "generator.max_turns=49"]) == 0
    out = capsys.readouterr().out
    assert "maze_2d/easy+maze_2d/hard, one line a row" in out
    assert re.search(r"; maze_2d/easy \d+\.\d% \(\d/2\), maze_2d/hard \d+\.\d% \(\d/2\)", out), out
    played = [json.loads(line) for line in (run / "eval_only.jsonl").read_text().splitlines()]
    assert [p["env_id"] for p in played] == ["maze_2d/easy"] * 2 + ["maze_2d/hard"] * 2


def test_an_eval_set_of_another_environment_is_evaluated_as_it_is(files, tmp_path, capsys):
    """An easy run's checkout (its dataset folder written for maze_2d/easy under other settings) asked
    to evaluate a file of hard mazes: the hard mazes are played, at their own picture size, and the
    run's dataset folder is not read."""
    old = old_dataset_folder(tmp_path)
    run = tmp_path / "run"
    assert driver.main(["--eval-only", "--eval-set", str(files / "hard.jsonl"), f"trainer.run_dir={run}",
                        f"data.dataset_dir={old}", "data.train_size=99"]) == 0
    out = capsys.readouterr().out
    assert "maze_2d/hard, one line a row" in out and "solve rate" in out
    played = [json.loads(line) for line in (run / "eval_only.jsonl").read_text().splitlines()]
    hard = [json.loads(line) for line in (files / "hard.jsonl").read_text().splitlines()]
    assert [p["seed"] for p in played] == [h["seed"] for h in hard]
    assert [p["optimal_moves"] for p in played] == [h["optimal_moves"] for h in hard]


@pytest.mark.parametrize("settings, words", [
    ([], ["has LoRA rank 4", "lora.rank is 16", "set the rank it was trained with"]),
    (["trainer.policy.model.lora.rank=4"], ["has LoRA alpha 8", "lora.alpha is 32", "set the alpha"]),
    (["trainer.policy.model.lora.rank=4", "trainer.policy.model.lora.alpha=8",
      "trainer.policy.model.lora.target_modules=q_proj,v_proj"],
     ["target_modules is q_proj,v_proj", "set the modules it was trained with"])])
def test_an_initial_adapter_of_another_lora_is_refused_before_anything_starts(adapter_dir, tmp_path, capsys,
                                                                            settings, words):
    run = tmp_path / "run"
    assert driver.main([f"trainer.policy.model.lora.init_from={adapter_dir}", f"trainer.run_dir={run}",
                        f"data.dataset_dir={run}/data", *settings]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and adapter_dir in err[0] and all(w in err[0] for w in words), err
    assert not run.exists()


def test_make_refuses_a_set_up_the_disk_cannot_hold_before_touching_anything(tmp_path):
    """A full disk once failed pip five times over an hour in CI; a venv's first set-up now says so at
    once. A venv already there (a stale stamp) is updated without the check: it needs no new room."""
    def setup(venv):
        return subprocess.run(["make", "setup", f"VENV={venv}", "MAIN_DISK_GIB=1000000"], capture_output=True,
                              text=True, timeout=60, cwd=Path(__file__).parents[1])
    venv = tmp_path / "venv"
    done = setup(venv)
    assert done.returncode != 0
    assert f"setting up {venv} needs about 1000000 GiB free" in done.stderr and "Free some space" in done.stderr
    assert not venv.exists()
    # a stand-in venv whose python accepts every pip command
    (tmp_path / "old" / "bin").mkdir(parents=True)
    python = tmp_path / "old" / "bin" / "python"
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    done = setup(tmp_path / "old")
    assert done.returncode == 0 and "GiB free" not in done.stderr, done.stderr
    assert (tmp_path / "old" / ".visrl-installed").exists()
