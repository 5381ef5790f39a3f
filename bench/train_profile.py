"""Where the train phase's time goes on a GPU: one FSDPPolicyShard in this process, no Ray.

    python bench/train_profile.py [--shape 8b] [--repeats 2] [--top 25] [key=value ...]

Builds a random-weight Qwen3-VL of the shape (bench/gpu_scale.py) and plays one rollout of
gpu_scale's workload (8 mazes x 8 samples, 5 turns, 16 sampled tokens, `cell_px=32`; with
`--shape default`, the shipped base and the default config's workload) through the hf engine,
so the shard trains on real sequences; the engine is then freed, as a colocated engine sleeps.
Each episode gets a random reward (random weights earn none; GRPO advantages), so every group trains. The
shard (the run's LoRA, dtype, micro-batches and gradient checkpointing) then scores the reference
with its adapter off and trains `--repeats` times after a warm-up; each pass prints its seconds
and MFU (4 x params x tokens / seconds / 989 TFLOP/s, as gpu_scale counts it). Last, the GPU
kernels of one more train by device time, the device's busy fraction of that wall time, and
cProfile's heaviest host functions of the same train; then, side by side, the same passes with
eager decoder layers (with `trainer.policy.model.compile_layers=true`) and then with PEFT's own
LoRA forward in place of vlm/lora_addmm.py's.
`key=value` overrides go to the run's config (for example `trainer.gradient_checkpointing=true
trainer.micro_train_batch_size_per_gpu=64`).
"""
import cProfile
import gc
import pstats
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(label: str, fn, tokens: int, params: int):
    import torch

    from bench.gpu_scale import PEAK_FLOPS
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(f"{label}: {seconds:.2f} s, {tokens / seconds:,.0f} tok/s, "
          f"MFU {100 * 4 * params * tokens / seconds / PEAK_FLOPS:.1f}% (4 x N; a forward alone is 2 x N), "
          f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    return out


def main():
    import torch

    from actors.local import local_runner
    from actors.policy_shard import FSDPPolicyShard
    from bench.gpu_scale import profile_config, profile_parser
    from envs.dataset import make_rows
    from rl.algorithm import compute_advantages
    from rl.batch import build_items
    from rl.rollout import rollout_tasks, training_sampling
    from vlm.load import compute_dtype, resolve_device

    args = profile_parser(__doc__, "train passes", "/tmp/train-profile").parse_args()
    out, cfg = profile_config(args)
    t = cfg.trainer

    runner, version = local_runner(cfg)
    rows, _ = make_rows(cfg.environment.env_class, 0, t.train_batch_size, cfg.generator.max_turns, False)
    episodes = runner.run(rollout_tasks(rows, 0, cfg.generator.n_samples_per_prompt), training_sampling(cfg, 0), version)
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    rng = np.random.default_rng(0)
    for ep in episodes:
        ep.reward = float(rng.random())
    algo = replace(t.algorithm, advantage_estimator="grpo")
    items = build_items(episodes, compute_advantages(algo, episodes), t.policy_mini_batch_size,
                        algo.loss_reduction)
    tokens = sum(len(it.seq.input_ids) for it in items)
    print(f"{len(items)} sequences, {tokens} tokens, {sum(it.n_scored for it in items)} scored; "
          f"micro-batches: forward {t.micro_forward_batch_size_per_gpu}, train {t.micro_train_batch_size_per_gpu}; "
          f"gradient checkpointing {t.gradient_checkpointing}", flush=True)

    shard = FSDPPolicyShard(t.policy.model.path, device=resolve_device(t.device), lora=asdict(t.policy.model.lora),
                            optimizer=asdict(t.policy.optimizer_config), total_steps=100, seed=t.seed,
                            threads=int(t.placement.cpus_per_bundle), dtype=compute_dtype(resolve_device(t.device)),
                            gradient_checkpointing=t.gradient_checkpointing,
                            compile_layers=t.policy.model.compile_layers,
                            max_tokens_per_micro_batch=t.max_tokens_per_micro_batch)
    shard.setup("127.0.0.1", 29533)
    params = sum(p.numel() for p in shard.model.parameters())
    ref = {}
    for k in range(2):
        ref = timed(f"reference, adapter off{' (warm-up)' if k == 0 else ''}",
                    lambda: shard.reference_logprobs(items, 1.0, t.micro_forward_batch_size_per_gpu), tokens, params)

    def train():
        return shard.train(items, algo, 1.0, t.micro_train_batch_size_per_gpu, t.update_epochs_per_batch, ref)
    for k in range(args.repeats + 1):
        torch.cuda.reset_peak_memory_stats()
        timed(f"train {k}{' (warm-up)' if k == 0 else ''}", train, tokens, params)

    host = cProfile.Profile()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as kernels:
        start = time.perf_counter()
        host.enable()
        train()
        torch.cuda.synchronize()
        host.disable()
        wall = time.perf_counter() - start
    averages = kernels.key_averages()
    busy = sum(e.self_device_time_total for e in averages) / 1e6
    print(f"profiled train: {wall:.2f} s wall, kernels {busy:.2f} s ({100 * busy / wall:.0f}% of the wall time busy)")
    print(averages.table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=70))
    pstats.Stats(host).sort_stats("tottime").print_stats(args.top)
    # side by side: the same passes with eager decoder layers (nn.Module.compile keeps the compiled
    # call here; without it the module's own runs), then with PEFT's own LoRA forward too
    if t.policy.model.compile_layers:
        from vlm.compiled_layers import decoder_layers
        for layer in decoder_layers(shard.model):
            layer._compiled_call_impl = None
        for k in range(args.repeats):
            timed(f"train {k}, eager decoder layers", train, tokens, params)
    restored = 0
    for module in shard.model.modules():
        if getattr(module, "_patched__addmm_forward", False):
            del module.forward  # the class's method (PEFT's) shows again
            restored += 1
    if restored:
        for k in range(args.repeats):
            timed(f"train {k}, PEFT's LoRA forward ({restored} layers)", train, tokens, params)
    shard.shutdown()


if __name__ == "__main__":
    main()
