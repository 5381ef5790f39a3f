"""Rollout throughput of the hf engine: episodes/s and generated tokens/s at N concurrent episodes.

    python bench/rollout_throughput.py [--episodes 64 512] [--threads 2]

Runs the real multi-turn rollout (EnvPool + VLLMEngine hf backend + RolloutRunner) in one process
on the shipped base model with the default config's chat format and sampling.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    import torch

    from actors.env_pool import EnvPool
    from actors.handles import EngineClient
    from actors.vllm_engine import VLLMEngine
    from envs.dataset import init_state
    from inference.requests import Sampling
    from rl.inputs import load_datasets, make_prompter
    from rl.rollout import RolloutRunner, Task
    from settings import load_config
    from vlm.load import resolve_model_path
    from vlm.processor import load_processor

    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(None, args.overrides + ["trainer.run_dir=runs/bench", "data.dataset_dir=runs/bench/data"])
    g = cfg.generator
    train_rows, _ = load_datasets(cfg)
    engine = VLLMEngine(cfg.trainer.policy.model.path)
    prompter = make_prompter(load_processor(resolve_model_path(cfg.trainer.policy.model.path)), cfg)
    env = EnvPool(cfg.environment.env_class, cfg.environment.cell_px, g.max_turns)
    runner = RolloutRunner.from_config(cfg, EngineClient([engine]).generate, prompter, env)
    sampling = Sampling(max_new_tokens=g.sampling_params.max_generate_length, temperature=g.sampling_params.temperature,
                        seed=1)
    print("| concurrent episodes | wall s | episodes/s | generated tokens/s | turns/episode | solved |")
    print("|---|---|---|---|---|---|")
    for n in args.episodes:
        tasks = [Task(f"b{i}", i, init_state(train_rows[i % len(train_rows)])) for i in range(n)]
        start = time.perf_counter()
        episodes = runner.run(tasks, sampling, 0)
        wall = time.perf_counter() - start
        tokens = sum(ep.generated_tokens for ep in episodes)
        turns = sum(len(ep.turns) for ep in episodes) / n
        solved = sum(ep.solved for ep in episodes) / n
        print(f"| {n} | {wall:.1f} | {n / wall:.2f} | {tokens / wall:.0f} | {turns:.1f} | {100 * solved:.0f}% |",
              flush=True)


if __name__ == "__main__":
    main()
