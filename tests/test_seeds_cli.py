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
