"""visrl driver: GRPO for a vision-language maze agent on Ray.

    python driver.py [--config FILE] [key=value ...]       train (the default: embedded CPU run)
    python driver.py --dry-run [key=value ...]             validate, print config and placement
    python driver.py --make-dataset DIR [key=value ...]    write train/eval sets + manifest
    python driver.py --eval-only [--adapter DIR|s3://...]  greedy eval on the eval set
"""
from __future__ import annotations

import argparse
import sys

from settings import ConfigError, load_config, to_yaml


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config (default: configs/default.yaml)")
    ap.add_argument("--dry-run", action="store_true", help="validate, print the resolved config and placement, exit")
    ap.add_argument("--make-dataset", metavar="DIR", help="write train.jsonl, eval.jsonl, manifest.json to DIR")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.train_batch_size=24")
    return ap.parse_args(argv)


def dry_run(cfg) -> None:
    from placement.plan import format_plan, make_plan
    print(to_yaml(cfg))
    print(format_plan(make_plan(cfg, use_gpu=cfg.trainer.device == "cuda")))


def make_dataset(cfg, out_dir: str) -> None:
    import json
    from envs.dataset import write_dataset
    d = cfg.data
    manifest = write_dataset(out_dir, cfg.environment.env_class, d.train_size, d.eval_size, d.train_seed_start,
                             d.eval_seed_start, cfg.generator.max_turns, d.solvable_only)
    print(json.dumps(manifest["splits"], indent=2))
    print(f"wrote {out_dir}/train.jsonl, eval.jsonl, manifest.json")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        dry_run(cfg)
        return 0
    if args.make_dataset:
        make_dataset(cfg, args.make_dataset)
        return 0
    raise SystemExit("training is not built yet")


if __name__ == "__main__":
    sys.exit(main())
