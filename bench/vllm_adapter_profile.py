"""Where vLLM's CPU build spends a rollout's time with a LoRA adapter loaded, against without.

    .venv-vllm/bin/python bench/vllm_adapter_profile.py [--episodes 64]

vLLM's engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so cProfile sees it. One
greedy rollout of N train mazes on the shipped base, warmed up, then profiled, first on the base
and then with an adapter of the default config's shape. Prints the wall time of each and the
functions with the largest own time, with the share spent in vLLM's LoRA path (PunicaWrapperCPU's
entry points, which run vllm/lora/ops: the CPU platform's torch versions of the punica ops).
"""
import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    from actors.env_pool import EnvPool
    from actors.handles import EngineClient
    from actors.vllm_engine import VLLMEngine, engine_settings
    from bench.rollout_throughput import random_adapter
    from inference.requests import Sampling
    from rl.inputs import load_datasets, make_prompters
    from rl.rollout import RolloutRunner, task_of
    from settings import load_config
    from storage.adapters import AdapterRef
    from vlm.processor import load_processor

    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    cfg = load_config(None, ["generator.inference_engine.backend=vllm", "trainer.run_dir=runs/bench",
                             "data.dataset_dir=runs/bench/data"])
    rows, _ = load_datasets(cfg)
    engine = VLLMEngine(cfg.trainer.policy.model.path, **engine_settings(cfg))
    runner = RolloutRunner.from_config(cfg, EngineClient([engine]).generate,
                                       make_prompters(load_processor(cfg.trainer.policy.model.path), cfg),
                                       EnvPool(cfg.environment.env_class, cfg.environment.cell_px, cfg.generator.max_turns))
    tasks = [task_of(rows[i], f"p{i}", i) for i in range(args.episodes)]
    sampling = Sampling(max_new_tokens=cfg.generator.sampling_params.max_generate_length, temperature=0.0)
    adapter = random_adapter(cfg, tempfile.mkdtemp(prefix="bench-adapter-"))
    for version, label in ((0, "base"), (1, "adapter")):
        if version:
            engine.load_adapter(AdapterRef(adapter, version))
        runner.run(tasks, sampling, version)  # warm-up
        profile = cProfile.Profile()
        start = time.perf_counter()
        profile.runcall(runner.run, tasks, sampling, version)
        wall = time.perf_counter() - start
        stats = pstats.Stats(profile)
        # the layers' entry points into the LoRA kernels (disjoint calls: no time counted twice)
        lora = sum(v[3] for k, v in stats.stats.items()
                   if k[0].endswith("punica_cpu.py") and k[2] in ("add_lora_linear", "add_lora_logits", "add_lora_embedding"))
        tokens = sum(len(t.response_ids) for ep in runner.run(tasks, sampling, version) for t in ep.turns)
        print(f"\n## {label}: {wall:.1f} s a rollout of {args.episodes} episodes ({tokens} generated tokens); "
              f"LoRA path {lora:.1f} s ({100 * lora / wall:.0f}%, profiled time)")
        stats.sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
