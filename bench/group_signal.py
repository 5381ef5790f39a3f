"""How much of a GRPO batch can teach anything, by sampling temperature.

    python bench/group_signal.py [--mazes 24] [--samples 8] [--temperatures 0 1.0 1.5 2.0] [overrides]

Samples `--samples` episodes on each of the first `--mazes` train mazes with the config's model
(the shipped base by default) and reports the sampled solve rate and how the groups split: a
group whose episodes all solve or all fail has zero GRPO advantage, so only `mixed` groups move
the policy.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    import numpy as np
    import torch

    from actors.env_pool import EnvPool
    from actors.handles import EngineClient
    from actors.vllm_engine import VLLMEngine
    from inference.requests import Sampling
    from rl.inputs import load_datasets, make_prompters
    from rl.rollout import RolloutRunner, task_of
    from settings import load_config
    from settings.load import parse_with_overrides
    from vlm.load import resolve_model_path
    from vlm.processor import load_processor

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mazes", type=int, default=24)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0, 1.5, 2.0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("overrides", nargs="*")
    args = parse_with_overrides(ap)
    torch.set_num_threads(args.threads)
    cfg = load_config(None, args.overrides + ["trainer.run_dir=runs/bench", "data.dataset_dir=runs/bench/data"])
    train_rows, _ = load_datasets(cfg)
    rows = train_rows[:args.mazes]
    path = cfg.trainer.policy.model.path
    env = EnvPool(cfg.environment.env_class, cfg.environment.cell_px, cfg.generator.max_turns)
    runner = RolloutRunner.from_config(cfg, EngineClient([VLLMEngine(path)]).generate,
                                       make_prompters(load_processor(resolve_model_path(path)), cfg), env)
    print("| temperature | sampled solve rate | mixed groups | all fail | all solve | invalid actions/episode | wall s |")
    print("|---|---|---|---|---|---|---|")
    for temperature in args.temperatures:
        start = time.perf_counter()
        tasks = [task_of(row, f"m{i}-{k}", i) for i, row in enumerate(rows)
                 for k in range(args.samples)]
        episodes = runner.run(tasks, Sampling(max_new_tokens=cfg.generator.sampling_params.max_generate_length,
                                              temperature=temperature, seed=1), 0)
        solved = np.array([ep.solved for ep in episodes]).reshape(len(rows), args.samples).sum(1)
        print(f"| {temperature:g} | {100 * solved.mean() / args.samples:.1f}% "
              f"| {100 * np.mean((solved > 0) & (solved < args.samples)):.0f}% | {100 * np.mean(solved == 0):.0f}% "
              f"| {100 * np.mean(solved == args.samples):.0f}% | {np.mean([ep.invalid_actions for ep in episodes]):.2f} "
              f"| {time.perf_counter() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()
