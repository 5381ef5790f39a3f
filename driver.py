"""visrl driver: multi-turn GRPO for a vision-language maze agent, on Ray.

    python driver.py [--config FILE] [key=value ...]         train (default: the embedded CPU run)
    python driver.py --dry-run [key=value ...]               validate; print config and placement
    python driver.py --make-dataset DIR [key=value ...]      write train/eval sets + manifest
    python driver.py --eval-only [--adapter DIR|s3://...]    greedy eval of a model (+ adapter)

One step, as DESIGN.md draws it:
    rollouts (VLLMEngine x N, EnvPool) -> group-relative advantages (GRPO)
      -> LoRA update on the frozen base (FSDPPolicyShard x N, RefShard x N for the KL term)
      -> adapter written to shared storage, engines load the new version
      -> periodic eval (the fixed eval mazes) and checkpoints (local folder or s3://)

What is simplified: the trainer scores each turn's tokens with the prompt that turn was sampled
from (turns merge into one sequence only when the context window keeps the whole history), and
old log-probs come from the engines unless `trainer.algorithm.use_rollout_logprobs=false`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from settings import ConfigError, load_config, to_yaml


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config (default: configs/default.yaml)")
    ap.add_argument("--dry-run", action="store_true", help="validate, print the resolved config and placement, exit")
    ap.add_argument("--make-dataset", metavar="DIR", help="write train.jsonl, eval.jsonl, manifest.json to DIR")
    ap.add_argument("--eval-only", action="store_true", help="evaluate greedily on the eval set and exit")
    ap.add_argument("--eval-set", metavar="FILE", help="with --eval-only: another eval .jsonl")
    ap.add_argument("--adapter", metavar="DIR", help="with --eval-only: a LoRA adapter folder or s3:// prefix")
    ap.add_argument("--chaos-kill-every", type=int, default=0, metavar="N",
                    help="kill a random actor every N steps (tests your recovery set-up; see docs/fault-tolerance.md)")
    ap.add_argument("--chaos-method", choices=("sigkill", "ray_kill", "mixed"), default="sigkill",
                    help="how --chaos-kill-every kills: SIGKILL of the actor's process, ray.kill, or alternating")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.train_batch_size=24")
    return ap.parse_intermixed_args(argv)


def train(cfg, chaos_kill_every: int = 0, chaos_method: str = "sigkill") -> dict:
    import ray
    from tqdm import tqdm

    from rl.session import ACTOR_FAILURES, Session

    s = Session(cfg)
    ray.init(address=cfg.ray.address, namespace=cfg.ray.namespace, include_dashboard=cfg.ray.include_dashboard,
             configure_logging=False)
    s.start_actors()
    s.resume()
    if s.step >= s.total_steps:
        print(f"the run in {s.run_dir} is complete ({s.step}/{s.total_steps} steps); start another with "
              f"trainer.resume_mode=none or a new trainer.run_dir")
        return s.finish()
    if cfg.trainer.eval_before_train and s.step == 0:
        s.log(0, s.evaluate(0))
    bar = tqdm(total=s.total_steps, initial=s.step, desc="GRPO", unit="step")
    while s.step < s.total_steps:
        step = s.step + 1
        started = time.perf_counter()
        s.phases.reset()
        try:
            rows, epoch = s.sampler.next_batch()
            episodes = s.rollouts(rows, step)                 # VLLMEngine x N + EnvPool
            advantages = s.advantages(episodes)               # group-relative (GRPO)
            metrics = s.update(episodes, advantages)          # ref log-probs, then LoRA update on the shards
            metrics |= s.sync_weights()                       # adapter v{step} -> every engine
            last = step == s.total_steps or step == cfg.trainer.stop_after_step
            if step % cfg.trainer.eval_interval == 0 or last:
                metrics |= s.evaluate(step)
            if step % cfg.trainer.hf_save_interval == 0 or last:
                metrics |= s.export(step)
            s.step = step
            if step % cfg.trainer.ckpt_interval == 0 or last:
                metrics |= s.checkpoint(step)
        except ACTOR_FAILURES as failure:
            s.recover(failure, step)                          # rebuild the actors, reload the latest checkpoint
            bar.n = s.step
            bar.refresh()
            continue
        metrics |= s.phases.metrics() | {"timing/step": time.perf_counter() - started, "epoch": epoch}
        s.log(step, metrics)
        bar.update(1)
        bar.write(s.step_line(step, metrics))
        if cfg.trainer.stop_after_step and step >= cfg.trainer.stop_after_step:
            bar.write(f"stopping after step {step} (trainer.stop_after_step); resume with trainer.resume_mode=latest")
            break
        if chaos_kill_every and step % chaos_kill_every == 0 and step < s.total_steps and step not in s.chaos_steps:
            s.chaos_kill(chaos_method)  # once per step number, so a redone step is not killed again
    bar.close()
    return s.finish()


def eval_only(cfg, eval_set: str | None, adapter: str | None) -> dict:
    from rl.session import evaluate_locally
    report = evaluate_locally(cfg, eval_set, adapter)
    print(json.dumps(report.summary()))
    print(report.line())
    return report.summary()


def dry_run(cfg) -> None:
    from placement.plan import format_plan, make_plan
    print(to_yaml(cfg))
    print(format_plan(make_plan(cfg, use_gpu=cfg.trainer.device == "cuda")))


def make_dataset(cfg, out_dir: str) -> None:
    from envs.dataset import write_dataset
    d = cfg.data
    manifest = write_dataset(out_dir, cfg.environment.env_class, d.train_size, d.eval_size, d.train_seed_start,
                             d.eval_seed_start, cfg.generator.max_turns, d.solvable_only)
    print(json.dumps(manifest["splits"], indent=2))
    print(f"wrote {Path(out_dir) / 'train.jsonl'}, eval.jsonl, manifest.json")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        dry_run(cfg)
    elif args.make_dataset:
        make_dataset(cfg, args.make_dataset)
    elif args.eval_only:
        eval_only(cfg, args.eval_set, args.adapter)
    else:
        train(cfg, args.chaos_kill_every, args.chaos_method)
    return 0


if __name__ == "__main__":
    sys.exit(main())
