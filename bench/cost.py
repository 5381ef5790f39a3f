"""What a finished run cost: its devices, wall-clock hours, device-hours and money at an hourly rate.

    python bench/cost.py runs/default --rate 4.10            # $ per GPU-hour (e.g. an on-demand H200)
    python bench/cost.py s3-run-copy/ --rate 98.32 --per node --gpus-per-node 8

The run's own record decides: its config.yaml (how many devices its placement holds: the policy
shards' devices, plus the engines' and the reference's where they do not share them) and its
metrics.jsonl (the wall clock from the first line to the last, and the sum of the steps' own times,
which leaves out start-up, the first eval and any time between a stop and its resume).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def devices_of(cfg) -> int:
    """Devices the run's placement holds: colocated, engines and reference shards share the policy's."""
    p, e = cfg.trainer.placement, cfg.generator.inference_engine
    policy = p.policy_num_nodes * p.policy_num_gpus_per_node
    if p.colocate_all:
        return policy
    ref = p.ref_num_nodes * p.ref_num_gpus_per_node if cfg.trainer.ref_source() == "shards" else 0
    return policy + e.num_engines * e.tensor_parallel_size + ref


def run_hours(metrics_path: Path) -> dict:
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    timed = [m for m in lines if "time" in m]
    if len(timed) < 2:
        raise SystemExit(f"{metrics_path}: fewer than two timed lines; has the run taken a step?")
    steps = [m for m in lines if m.get("step", 0) > 0]
    return {"steps": max((m["step"] for m in steps), default=0),
            "wall_h": (timed[-1]["time"] - timed[0]["time"]) / 3600,
            "steps_h": sum(m.get("timing/step", 0.0) for m in steps) / 3600}


def cost(run_dir: Path, rate: float, per: str = "gpu", gpus_per_node: int = 8) -> dict:
    from settings import load_config
    for name in ("config.yaml", "metrics.jsonl"):
        if not (run_dir / name).is_file():
            raise SystemExit(f"{run_dir / name} not found: give a run's folder (trainer.run_dir)")
    cfg = load_config(run_dir / "config.yaml")
    devices = devices_of(cfg)
    hours = run_hours(run_dir / "metrics.jsonl")
    # a node's rate buys whole nodes: the devices round up to them
    units = -(-devices // gpus_per_node) * gpus_per_node if per == "node" else devices
    per_device = rate / gpus_per_node if per == "node" else rate
    return hours | {"device": cfg.trainer.device, "devices": devices, "billed_devices": units,
                    "device_h": units * hours["wall_h"], "cost": units * hours["wall_h"] * per_device,
                    "cost_steps_only": units * hours["steps_h"] * per_device}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="the run's folder (trainer.run_dir): config.yaml and metrics.jsonl")
    ap.add_argument("--rate", type=float, required=True, help="the price of an hour (of a GPU, or of a node: --per)")
    ap.add_argument("--per", choices=("gpu", "node"), default="gpu", help="what --rate buys an hour")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="with --per node: the devices a node holds")
    args = ap.parse_args(argv)
    if args.rate < 0 or args.gpus_per_node < 1:
        ap.error("--rate must be >= 0 and --gpus-per-node >= 1")
    c = cost(args.run_dir, args.rate, args.per, args.gpus_per_node)
    print(f"{args.run_dir}: {c['steps']} steps on {c['devices']} device(s) ({c['device']}), billed for "
          f"{c['billed_devices']}")
    print(f"wall clock {c['wall_h']:.3f} h (the steps themselves {c['steps_h']:.3f} h)")
    print(f"device-hours {c['device_h']:.3f}; cost {c['cost']:.2f} at {args.rate:g} per {args.per}-hour "
          f"({c['cost_steps_only']:.2f} for the steps alone)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
