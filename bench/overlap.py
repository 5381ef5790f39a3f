"""Rollouts and training at once, measured: the same run under three schedules, one after another.

    python bench/overlap.py                          # a local cluster: engines and shards on their own nodes
    python bench/overlap.py --here trainer.device=cuda             # this machine's own Ray (one GPU)
    python bench/overlap.py --here --shape 8b                      # gpu_scale.py's 8B shape and short workload

Schedules (the same loss in all three: old log-probs recomputed by the trainer, truncated importance
sampling toward the engines', so only the schedule differs):
- colocated, synchronous: engines and shards share each device and take turns (the default);
- separate, synchronous: engines and shards each on their own, still taking turns;
- separate, one-step-off: the engines generate the next batch while the shards train
  (`trainer.fully_async.enabled`).
On the local cluster (deploy/local_cluster.py: two worker nodes, one `visrl_device` slot each) the
colocated run's bundle takes both CPUs of one node, and the separate runs' engine and shard a CPU
each on nodes of their own. With --here on one GPU there is no second device: "separate" is the
engine and the shards as separate processes on the one GPU, both awake (enable_sleep=false).

Each run is the default config for --steps steps, no eval, no checkpoint but the last; with --shape,
bench/gpu_scale.py's random-weight model of that shape, built on the GPU, and its `short` workload
(LoRA r32, 8 prompts x 8 samples x 5 turns x 16 new tokens).
Columns, means over the steps after the first: seconds a step, steps an hour, the share of a step
each pool is busy (engines: the batch's generation, in the step or beside it; shards: reference
scoring and update), and the time a step waits for its rollouts.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SAME_LOSS = ["trainer.algorithm.use_tis=true", "trainer.algorithm.use_rollout_logprobs=false"]
SCHEDULES = {
    "colocated, synchronous": ["trainer.placement.colocate_all=true"],
    "separate, synchronous": ["trainer.placement.colocate_all=false"],
    "separate, one-step-off": ["trainer.placement.colocate_all=false", "trainer.fully_async.enabled=true"],
}
ONE_DEVICE = {  # --here: one GPU holds both pools; separate processes on it, both awake
    "colocated, synchronous": ["trainer.placement.colocate_all=true"],
    "separate, synchronous": ["trainer.placement.colocate_all=true", "generator.inference_engine.enable_sleep=false"],
    "separate, one-step-off": ["trainer.placement.colocate_all=true", "generator.inference_engine.enable_sleep=false",
                               "trainer.fully_async.enabled=true"],
}
ON_CLUSTER = {"colocated, synchronous": ["trainer.placement.cpus_per_bundle=2"],
              "separate, synchronous": ["trainer.placement.cpus_per_bundle=1"],
              "separate, one-step-off": ["trainer.placement.cpus_per_bundle=1"]}


def run_schedule(name: str, overrides: list[str], steps: int, out: Path, env: dict, batch: int) -> list[dict]:
    run = out / name.replace(", ", "-").replace(" ", "_")
    args = SAME_LOSS + overrides + [
        f"data.train_size={batch * steps}", f"trainer.train_batch_size={batch}", "trainer.epochs=1",
        "trainer.eval_before_train=false", "trainer.eval_interval=1000", "trainer.hf_save_interval=1000",
        f"trainer.ckpt_interval={steps}", "trainer.resume_mode=none", f"trainer.run_dir={run}",
        f"trainer.ckpt_path={run}/ckpts", f"trainer.export_path={run}/exports", f"data.dataset_dir={run}/data"]
    print(f"{name}: python driver.py {' '.join(args)}", flush=True)
    done = subprocess.run([sys.executable, "driver.py", *args], cwd=ROOT, env=env, timeout=7200,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}: the driver failed:\n{done.stderr[-3000:]}")
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [m for m in lines if m.get("step", 0) > 0]


def summary(steps: list[dict]) -> dict:
    """Means over the steps after the first (it loads and warms up everything)."""
    rows = steps[1:] or steps

    def mean(f):
        return sum(f(m) for m in rows) / len(rows)
    step = mean(lambda m: m["timing/step"])
    generate = mean(lambda m: m.get("async/generate_s", m.get("timing/generate", 0.0)))
    train = mean(lambda m: m.get("timing/ref", 0.0) + m.get("timing/train", 0.0))
    return {"step_s": step, "steps_per_hour": 3600 / step, "engines_busy": generate / step,
            "shards_busy": train / step, "wait_s": mean(lambda m: m.get("timing/generate", 0.0)),
            "generate_s": generate, "train_s": train, "steps": len(rows),
            "staleness": mean(lambda m: m.get("async/staleness", 0.0)),
            "reward": mean(lambda m: m.get("reward/avg_raw_reward", 0.0))}


def table(results: dict) -> str:
    base = results.get("colocated, synchronous")
    rows = ["| schedule | s a step | steps an hour | vs colocated | engines busy | shards busy | waits for rollouts "
            "| staleness |", "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        ratio = f"{base['step_s'] / r['step_s']:.2f}x" if base else "-"
        rows.append(f"| {name} | {r['step_s']:.1f} | {r['steps_per_hour']:.0f} | {ratio} | {100 * r['engines_busy']:.0f}% "
                    f"| {100 * r['shards_busy']:.0f}% | {r['wait_s']:.1f} s | {r['staleness']:.1f} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    from settings.load import parse_with_overrides
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, help="prompts a step (default: the default config's 16, or the shape's)")
    ap.add_argument("--here", action="store_true", help="this machine's own Ray instead of a local cluster")
    ap.add_argument("--shape", choices=["2b", "8b"], help="bench/gpu_scale.py's model and workload (a GPU)")
    ap.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=list(SCHEDULES))
    ap.add_argument("--out", type=Path, help="runs and the cluster's files (default: a temporary folder)")
    ap.add_argument("overrides", nargs="*")
    args = parse_with_overrides(ap, argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="visrl-overlap-"))
    extra, batch = list(args.overrides), args.batch or 16
    if args.shape:
        from bench.gpu_scale import WORKLOADS, build, workload
        model = out / f"model-{args.shape}"
        if not (model / "config.json").exists():
            build(args.shape, model)
        extra = workload(model, out / "unused", 1) + extra  # its run folders and sizes are overridden below
        batch = args.batch or WORKLOADS["short"][0]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    cluster = None
    if not args.here:
        from deploy.local_cluster import LocalCluster
        cluster = LocalCluster(out / "cluster")
        cluster.up(workers=2, cpus=2, devices=1)
        env = cluster.env()
        extra = ["ray.address=auto", "trainer.placement.device_resource=visrl_device"] + extra
    results = {}
    try:
        for name in args.schedules:
            schedule = (SCHEDULES[name] + ON_CLUSTER[name]) if cluster else ONE_DEVICE[name]
            results[name] = summary(run_schedule(name, schedule + extra, args.steps, out, env, batch))
            print(f"{name}: {json.dumps({k: round(v, 3) for k, v in results[name].items()})}", flush=True)
    finally:
        if cluster:
            cluster.down()
    where = "a local cluster, two worker nodes" if cluster else "this machine"
    print(f"{where}; {os.cpu_count()} CPUs; {args.steps} steps of {batch} prompts a schedule; "
          f"overrides: {' '.join(extra) or 'none'}")
    print(table(results))
    (out / "overlap.json").write_text(json.dumps(results, indent=1))
    print(f"figures in {out / 'overlap.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
