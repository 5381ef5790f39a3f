"""bench/seeds.py's command line: overrides may follow the seed list directly."""
from bench.seeds import parse_args


def test_overrides_right_after_the_seed_list_are_overrides_not_seeds():
    args = parse_args(["--seeds", "42", "0", "trainer.ckpt_interval=5", "--name", "kl", "trainer.seed=3"])
    assert args.seeds == [42, 0] and args.name == "kl"
    assert args.overrides == ["trainer.ckpt_interval=5", "trainer.seed=3"]
    args = parse_args(["--config=configs/hard.yaml", "--parallel", "2"])
    assert args.config == "configs/hard.yaml" and args.parallel == 2 and args.seeds == [0, 1, 2] and not args.overrides
