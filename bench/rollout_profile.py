"""Where a rollout's time goes on a GPU: the hf engine and the env pool in one process, no Ray.

    python bench/rollout_profile.py [--shape 8b] [--repeats 2] [--top 25] [key=value ...]

Builds a random-weight Qwen3-VL of the shape (bench/gpu_scale.py), loads a random LoRA adapter of
the workload's shape (r32, all linear layers) and runs gpu_scale's rollout (8 mazes x 8 samples,
5 turns, 16 sampled tokens, `cell_px=32`; with `--shape default`, the shipped base and the default
config's workload) through the real RolloutRunner. Each rollout's wall time
is split into: decode (prefill and sampling, in `generate` or the engine's own loop with
`generator.inference_engine.cuda_graphs`; the device synchronised on both sides; of it, the own
loop's prefill), picture
preprocessing, env reset/step, prompt building, and the rest (with `--sleep`, the engine's sleep
and wake, as in a colocated step); then cProfile's heaviest functions of the last rollout by own
time, and the GPU kernels of one more rollout by device time.
`key=value` overrides go to the run's config (for example `generator.inference_engine.merge_lora=true`).
"""
import cProfile
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class Timers:
    """Wraps methods so every call adds its seconds to a named total."""

    def __init__(self, sync):
        self.total, self.sync, self.nested = defaultdict(float), sync, set()

    def wrap(self, owner, name: str, label: str, synced: bool = False, nested: bool = False):
        """nested: the calls run inside another timed one (their seconds are part of its)."""
        if nested:
            self.nested.add(label)
        inner = getattr(owner, name)

        def timed(*a, **kw):
            if synced:
                self.sync()
            start = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                if synced:
                    self.sync()
                self.total[label] += time.perf_counter() - start
        setattr(owner, name, timed)

    def outermost(self) -> float:
        return sum(s for label, s in self.total.items() if label not in self.nested)


def main():
    import torch

    from actors.local import local_runner
    from bench.gpu_scale import profile_config, profile_parser
    from bench.rollout_throughput import random_adapter
    from envs.dataset import make_rows
    from inference.graph_decode import GraphDecoder
    from rl.rollout import rollout_tasks, training_sampling

    ap = profile_parser(__doc__, "rollouts", "/tmp/rollout-profile")
    ap.add_argument("--sleep", action="store_true", help="sleep and wake the engine before each rollout, as a "
                    "colocated step does (the weights move, so CUDA graphs are captured again)")
    args = ap.parse_args()
    out, cfg = profile_config(args)
    adapter = random_adapter(cfg, tempfile.mkdtemp(prefix="visrl-adapter-"))
    runner, version = local_runner(cfg, adapter)
    engine = runner.generate.__self__.engines[0]
    backend = engine.backend
    rows, _ = make_rows(cfg.environment.env_class, 0, cfg.trainer.train_batch_size, cfg.generator.max_turns, False)
    timers = Timers(torch.cuda.synchronize)
    timers.wrap(backend, "_decode", "decode", synced=True)
    timers.wrap(GraphDecoder, "_prefill", "of which prefill", synced=True, nested=True)
    timers.wrap(backend, "_encode_images", "picture preprocessing")
    timers.wrap(runner.env, "step", "env step")
    timers.wrap(runner.env, "reset", "env reset")
    for prompter in runner.prompters.values():
        timers.wrap(prompter, "prompt", "prompt building")
    for k in range(args.repeats + 1):
        timers.total.clear()
        profile = cProfile.Profile() if k == args.repeats else None
        tasks = rollout_tasks(rows, k, cfg.generator.n_samples_per_prompt)
        torch.cuda.synchronize()
        start = time.perf_counter()
        if args.sleep and k:
            engine.sleep()
            engine.wake_up()
        if profile:
            profile.enable()
        episodes = runner.run(tasks, training_sampling(cfg, k), version)
        if profile:
            profile.disable()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        turns = sum(len(e.turns) for e in episodes)
        tokens = sum(e.generated_tokens for e in episodes)
        parts = ", ".join(f"{name} {s:.2f}" for name, s in sorted(timers.total.items(), key=lambda kv: -kv[1]))
        decoder = backend.decoder
        graphs = (f", {decoder.captures} graphs captured in {decoder.capture_s:.2f} s and {decoder.prefilled_rows} "
                  f"distinct prompts prefilled so far" if decoder else "")
        print(f"rollout {k}{' (warm-up)' if k == 0 else ''}: {wall:.2f} s, {turns} turns, {tokens} tokens | "
              f"{parts}, rest {wall - timers.outermost():.2f} s{graphs}", flush=True)
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as kernels:
        runner.run(tasks, training_sampling(cfg, args.repeats), version)
        torch.cuda.synchronize()
    print(kernels.key_averages().table(sort_by="self_device_time_total", row_limit=args.top, max_name_column_width=70))


if __name__ == "__main__":
    main()
