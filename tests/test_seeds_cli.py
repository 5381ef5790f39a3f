"""bench/seeds.py's command line: overrides may follow the seed list directly, and name the seed."""
from bench.seeds import parse_args


def test_overrides_right_after_the_seed_list_are_overrides_not_seeds():
    args = parse_args(["--seeds", "42", "0", "trainer.ckpt_interval=5", "--name", "kl", "trainer.seed=3"])
    assert args.seeds == [42, 0] and args.name == "kl"
    assert args.overrides == ["trainer.ckpt_interval=5", "trainer.seed=3"]
    args = parse_args(["--config=configs/hard.yaml", "--parallel", "2"])
    assert args.config == "configs/hard.yaml" and args.parallel == 2 and args.seeds == [0, 1, 2] and not args.overrides


def test_seed_in_an_override_stands_for_each_seed():
    from pathlib import Path

    from bench.seeds import seed_args
    init = "trainer.policy.model.lora.init_from=runs/seeds/easy/seed_{seed}/exports/global_step_64/policy"
    args = seed_args(3, Path("runs/seeds/hard/seed_3"), "configs/hard.yaml", [init, "trainer.epochs=1"])
    assert "trainer.policy.model.lora.init_from=runs/seeds/easy/seed_3/exports/global_step_64/policy" in args
    assert "trainer.epochs=1" in args and "trainer.seed=3" in args and not any("{seed}" in a for a in args)
