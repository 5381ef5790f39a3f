"""Bytes across the wire by sharding design, counted on a real multi-node Ray cluster on this machine.

    python bench/comm.py                     # 2 worker nodes x 2 device slots, the embedded base
    python bench/comm.py --steps 3 --designs -1 2

For each `trainer.policy.fsdp_config.fsdp_size` (-1: every block sharded over all 4 policy shards;
2: hybrid, sharded inside a node's pair and replicated across the nodes; 1: the base whole on every
shard, only LoRA gradients all-reduced) the real driver runs a few GRPO steps on a local cluster
(deploy/local_cluster.py: two worker nodes, two `visrl_device` slots each, gloo between processes)
with `record_collectives=true`, and the table gives each process group's bytes a rank sends a step,
by kind, with the seconds they took. The groups: `world` (all 4 shards), `shard` (a node's pair),
`replicate` (one shard a node). Bytes scale with the base's size; the 8B shape's are these times
the ratio of parameters (docs/cluster.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DESIGNS = {-1: "full shard", 2: "hybrid (shard in a node)", 1: "base whole, LoRA all-reduced"}
# 4 policy shards on 2 nodes (2 a node), their engines beside them; a few small steps
CLUSTER_RUN = ["trainer.placement.policy_num_nodes=2", "trainer.placement.policy_num_gpus_per_node=2",
               "trainer.placement.ref_num_nodes=2", "trainer.placement.ref_num_gpus_per_node=2",
               "generator.inference_engine.num_engines=4", "trainer.placement.device_resource=visrl_device",
               "trainer.placement.cpus_per_bundle=0.5", "trainer.train_batch_size=4", "trainer.policy_mini_batch_size=4",
               "generator.n_samples_per_prompt=4", "data.eval_size=4", "trainer.eval_interval=100",
               "trainer.hf_save_interval=100", "trainer.eval_before_train=false",
               "trainer.policy.fsdp_config.record_collectives=true"]


def run_design(cluster, fsdp_size: int, steps: int, out: Path) -> list[dict]:
    run = out / f"fsdp{fsdp_size}"
    args = CLUSTER_RUN + [f"trainer.policy.fsdp_config.fsdp_size={fsdp_size}", f"data.train_size={4 * steps}",
                          f"trainer.run_dir={run}", f"trainer.ckpt_path={run}/ckpts",
                          f"trainer.export_path={run}/exports", f"data.dataset_dir={run}/data"]
    done = subprocess.run([sys.executable, "driver.py", *args], cwd=ROOT, capture_output=True, text=True,
                          env=cluster.env(), timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"fsdp_size={fsdp_size}: the driver failed:\n{done.stderr[-3000:]}")
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [m for m in lines if m.get("step", 0) > 0]


def per_step(steps: list[dict]) -> dict:
    """The mean over steps of each comm/* metric and the train phase's time."""
    sums = defaultdict(float)
    for m in steps:
        for k, v in m.items():
            if k.startswith("comm/") or k == "timing/train":
                sums[k] += v
    return {k: v / len(steps) for k, v in sums.items()}


def table(results: dict) -> str:
    keys = sorted({k[:-len("_bytes")] for r in results.values() for k in r if k.endswith("_bytes")
                   and k != "comm/total_bytes"})
    head = "| group / kind | " + " | ".join(f"fsdp_size={d} ({DESIGNS[d]})" for d in results) + " |"
    rows = [head, "|---" * (len(results) + 1) + "|"]
    for key in keys + ["comm/total"]:
        cells = []
        for r in results.values():
            b, s = r.get(f"{key}_bytes"), r.get(f"{key}_s")
            cells.append("-" if not b else f"{b / 2**20:.2f} MiB, {s:.3f} s")
        rows.append(f"| {key[len('comm/'):]} | " + " | ".join(cells) + " |")
    rows.append("| train phase (recording on) | " + " | ".join(f"{r['timing/train']:.1f} s" for r in results.values()) + " |")
    return "\n".join(rows)


def model_bytes() -> tuple[int, int, int]:
    """The embedded base's frozen bytes, its root unit's (everything outside the blocks FSDP wraps one
    by one) and the LoRA weights', as the CPU shards hold them (fp32), with the default LoRA."""
    from dataclasses import asdict

    from peft import get_peft_model

    from actors.policy_shard import lora_config
    from settings import load_config
    from vlm.load import load_model
    cfg = load_config(None, [])
    model, _ = load_model(cfg.trainer.policy.model.path, "cpu")
    model = get_peft_model(model, lora_config(asdict(cfg.trainer.policy.model.lora)))
    frozen = sum(p.numel() * 4 for p in model.parameters() if not p.requires_grad)
    blocks = [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "VisionBlock"))]
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    root = sum(p.numel() * 4 for p in model.parameters() if id(p) not in in_blocks)
    return frozen, root, sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--designs", type=int, nargs="+", default=[-1, 2, 1], choices=sorted(DESIGNS))
    ap.add_argument("--out", type=Path, help="runs and the cluster's files (default: a temporary folder)")
    args = ap.parse_args(argv)
    import torch

    from deploy.local_cluster import LocalCluster
    out = args.out or Path(tempfile.mkdtemp(prefix="visrl-comm-"))
    cluster = LocalCluster(out / "cluster")
    cluster.up(workers=2, cpus=2, devices=2)
    try:
        results = {d: per_step(run_design(cluster, d, args.steps, out)) for d in args.designs}
    finally:
        cluster.down()
    print(f"torch {torch.__version__}, gloo, {os.cpu_count()} CPUs; the embedded base; {args.steps} steps a design; "
          "bytes one rank sends a step")
    print(table(results))
    base, root, lora = model_bytes()
    record = {"base_bytes": base, "root_bytes": root, "lora_bytes": lora, "shards": 4, "per_node": 2,
              "designs": {str(d): r for d, r in results.items()}}
    (out / "comm.json").write_text(json.dumps(record, indent=1))
    print(f"counts in {out / 'comm.json'} (bench/step_model.py --measured)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
