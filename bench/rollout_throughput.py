"""Rollout throughput of an engine: episodes/s and generated tokens/s at N concurrent episodes.

    python bench/rollout_throughput.py [--episodes 64 512] [--threads 2]
    .venv-vllm/bin/python bench/rollout_throughput.py --backends hf vllm --adapter random --episodes 64
    python bench/rollout_throughput.py --device cuda --backends vllm --adapter random --episodes 192 \
        trainer.policy.model.path=MODEL environment.cell_px=32 ...     (a GPU, another model)

Runs the real multi-turn rollout (EnvPool + VLLMEngine + RolloutRunner) in one process on the
shipped base model with the default config's chat format and sampling, for each backend, without
and (with --adapter) with a LoRA adapter. `--adapter random` makes one of the default config's
shape (rank 16 on the language layers): speed depends on the shape, not on the values. Each
(backend, adapter) pair runs once unmeasured first, so start-up and first-call work are left out.
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def random_adapter(cfg, out: str, seed: int = 0, dtype=None) -> str:
    """A PEFT adapter of the run's LoRA shape with non-zero weights."""
    from dataclasses import asdict

    import torch
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from actors.policy_shard import lora_config
    torch.manual_seed(seed)
    config = lora_config(asdict(cfg.trainer.policy.model.lora))
    config.init_lora_weights = False
    # bf16 where the model is large: an 8B base in fp32 is 32 GB of host memory for an adapter of a few MB
    model = get_peft_model(AutoModelForImageTextToText.from_pretrained(cfg.trainer.policy.model.path, dtype=dtype), config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.05)  # small: answers stay in format, so episodes last as long as the base's
    model.save_pretrained(out)
    return out


def main():
    import torch

    from actors.env_pool import EnvPool
    from actors.handles import EngineClient
    from actors.vllm_engine import VLLMEngine, engine_settings
    from inference.requests import Sampling
    from rl.inputs import load_datasets, make_prompters
    from rl.rollout import RolloutRunner, task_of
    from settings import load_config
    from settings.load import parse_with_overrides
    from storage.adapters import AdapterRef
    from vlm.load import compute_dtype, resolve_model_path
    from vlm.processor import load_processor

    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--backends", nargs="+", default=["hf"], choices=["hf", "vllm"])
    ap.add_argument("--adapter", default="", help="an adapter folder, or 'random' (the default config's shape)")
    ap.add_argument("overrides", nargs="*")
    args = parse_with_overrides(ap)
    torch.set_num_threads(args.threads)
    cfg = load_config(None, args.overrides + ["trainer.run_dir=runs/bench", "data.dataset_dir=runs/bench/data"])
    g = cfg.generator
    train_rows, _ = load_datasets(cfg)
    dtype = compute_dtype(args.device)
    adapter = (random_adapter(cfg, tempfile.mkdtemp(prefix="bench-adapter-"), dtype=getattr(torch, dtype))
               if args.adapter == "random" else args.adapter)
    prompter = make_prompters(load_processor(resolve_model_path(cfg.trainer.policy.model.path)), cfg)
    env = EnvPool(cfg.environment.env_class, cfg.environment.cell_px, g.max_turns)
    sampling = Sampling(max_new_tokens=g.sampling_params.max_generate_length, temperature=g.sampling_params.temperature,
                        seed=1)
    print("| backend | adapter | concurrent episodes | wall s | episodes/s | generated tokens/s | turns/episode | solved |")
    print("|---|---|---|---|---|---|---|---|")
    for backend in args.backends:
        cfg.generator.inference_engine.backend = backend
        engine = VLLMEngine(cfg.trainer.policy.model.path, device=args.device, dtype=dtype, threads=args.threads,
                            **engine_settings(cfg))
        runner = RolloutRunner.from_config(cfg, EngineClient([engine]).generate, prompter, env)
        for version, folder in [(0, None)] + ([(1, adapter)] if adapter else []):
            if folder:
                engine.load_adapter(AdapterRef(folder, version))
            for k, n in enumerate([args.episodes[0]] + args.episodes):  # the first run warms up
                tasks = [task_of(train_rows[i % len(train_rows)], f"b{i}", i) for i in range(n)]
                start = time.perf_counter()
                episodes = runner.run(tasks, sampling, version)
                wall = time.perf_counter() - start
                tokens = sum(ep.generated_tokens for ep in episodes)
                turns = sum(len(ep.turns) for ep in episodes) / n
                solved = sum(ep.solved for ep in episodes) / n
                if k == 0:
                    continue
                print(f"| {backend} | {'yes' if folder else 'no'} | {n} | {wall:.1f} | {n / wall:.2f} | "
                      f"{tokens / wall:.0f} | {turns:.1f} | {100 * solved:.0f}% |", flush=True)
        del engine, runner


if __name__ == "__main__":
    main()
