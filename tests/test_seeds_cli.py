"""tools/seeds.py's command line: overrides may follow the seed list directly, and name the seed; several
held-out sets are each evaluated."""
import pytest

from tools.seeds import parse_args


def test_overrides_right_after_the_seed_list_are_overrides_not_seeds():
    args = parse_args(["--seeds", "42", "0", "trainer.ckpt_interval=5", "--name", "kl", "trainer.seed=3"])
    assert args.seeds == [42, 0] and args.name == "kl"
    assert args.overrides == ["trainer.ckpt_interval=5", "trainer.seed=3"]
    args = parse_args(["--config=configs/hard.yaml", "--parallel", "2"])
    assert args.config == "configs/hard.yaml" and args.parallel == 2 and args.seeds == [0, 1, 2] and not args.overrides


def test_seed_in_an_override_stands_for_each_seed():
    from pathlib import Path

    from tools.seeds import seed_args
    init = "trainer.policy.model.lora.init_from=runs/seeds/easy/seed_{seed}/exports/global_step_64/policy"
    args = seed_args(3, Path("runs/seeds/hard/seed_3"), "configs/hard.yaml", [init, "trainer.epochs=1"])
    assert "trainer.policy.model.lora.init_from=runs/seeds/easy/seed_3/exports/global_step_64/policy" in args
    assert "trainer.epochs=1" in args and "trainer.seed=3" in args and not any("{seed}" in a for a in args)


def test_a_report_on_runs_that_are_not_there_names_them_and_creates_nothing(tmp_path):
    import subprocess
    import sys

    from tests.helpers import ROOT
    out = subprocess.run([sys.executable, "tools/seeds.py", "--seeds", "1", "2", "--no-run", "--runs", str(tmp_path),
                          "--name", "never"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "holds none for seed(s) 1, 2" in out.stderr and "without --no-run" in out.stderr
    assert "Traceback" not in out.stderr and not any(tmp_path.iterdir())


@pytest.mark.slow
def test_each_heldout_set_is_evaluated_into_its_own_folder(tiny_model_dir, tmp_path):
    import json

    from envs.registry import get_environment
    from tests.helpers import make_adapter
    from tools.seeds import run_seed
    assert parse_args(["--heldout", "a.jsonl", "--heldout", "b.jsonl"]).heldout == ["a.jsonl", "b.jsonl"]
    # a seed's folder as a finished run leaves it: curve, eval rows, adapters (v2 the final one)
    folder = tmp_path / "seed_0"
    (folder / "eval").mkdir(parents=True)
    (folder / "wall_s.txt").write_text("12.5\n")
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "eval/all/avg_score": v}) + "\n"
                                                  for s, v in ((0, 0.25), (1, 0.5))))
    (folder / "eval" / "step_00001.jsonl").write_text(json.dumps({"optimal_moves": 2, "solved": True}) + "\n")
    make_adapter(tiny_model_dir, folder / "adapters" / "v1", seed=1)
    make_adapter(tiny_model_dir, folder / "adapters" / "v2", seed=2)
    sets = []
    for name, start in (("a", 100), ("b", 200)):  # two sets of other sizes and seeds
        rows = get_environment("maze_2d/easy").make_rows(start, 2 if name == "a" else 3, 3, solvable_only=False)
        sets.append(tmp_path / f"{name}.jsonl")
        sets[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = [f"trainer.policy.model.path={tiny_model_dir}", "generator.max_turns=3",
                 "trainer.placement.cpus_per_bundle=1"]
    result = run_seed(0, folder, None, overrides, heldout=[str(s) for s in sets], run=False)
    assert result["final"] == 0.5 and result["heldout_adapter"] == "v2"
    for key, eval_set in (("heldout", sets[0]), ("heldout2", sets[1])):
        rows = [json.loads(line) for line in (folder / key / "eval_only.jsonl").read_text().splitlines()]
        assert [r["seed"] for r in rows] == [json.loads(line)["seed"] for line in eval_set.read_text().splitlines()]
        assert result[key] == sum(r["solved"] for r in rows) / len(rows)


@pytest.mark.slow
def test_stopping_the_command_stops_its_runs_and_starts_no_other_seed(tiny_model_dir, tmp_path):
    """A seed's driver.py left running would go on writing checkpoints into its folder after the command
    was stopped; the next seed in the queue must not start either."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import psutil
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "tools/seeds.py", "--seeds", "0", "1", "--name", "stop", "--runs", str(tmp_path),
           f"trainer.policy.model.path={tiny_model_dir}", "trainer.placement.cpus_per_bundle=1", "trainer.epochs=50"]
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        runs = []
        while not runs and time.monotonic() < deadline and proc.poll() is None:
            runs = [c for c in psutil.Process(proc.pid).children() if "driver.py" in " ".join(c.cmdline())]
            time.sleep(0.5)
        assert runs, "seeds.py started no driver.py"
        time.sleep(5)  # into the run's start-up
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0 and "stopped" in out, out
    gone, alive = psutil.wait_procs(runs, timeout=10)
    for run in alive:  # the failure below leaves nothing running
        run.kill()
    assert not alive, f"driver.py still running after seeds.py stopped: {alive}"
    assert (tmp_path / "stop" / "seed_0").is_dir() and not (tmp_path / "stop" / "seed_1").exists()
