"""Lost nodes, measured: a run on a local multi-node cluster whose worker nodes are killed (SIGKILL of
the raylet and every process on it) mid-generate, mid-train and during checkpoint saves, each
replaced by deploy/local_cluster.py's platform loop, with checkpoints on a local S3 server.

    python bench/node_loss.py [--replace-after 10] [--out runs/node_loss]

The default config, shortened (4 mazes of 4 samples a step, 10 steps, a checkpoint every 2), with
the policy and its engine on two worker nodes. Per kill: whether the run recovered, the steps lost
(redone), how long the driver waited for the cluster, and the time from the replacement node
being placed again (the replacement had joined) to the next finished step. Then every checkpoint is
verified and every step is checked to be in metrics.jsonl exactly once.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

KILLS = ["generate@2", "train@3", "ckpt@4", "generate@5", "train@7", "ckpt@8", "train@9"]


def main():
    from actors.checkpointer import Checkpointer
    from deploy.local_cluster import LocalCluster
    from deploy.local_s3 import S3Server
    from settings.schema import S3Config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replace-after", type=float, default=10.0, help="seconds from a node's loss to its replacement")
    ap.add_argument("--out", default="runs/node_loss")
    args = ap.parse_args()
    out = (ROOT / args.out).resolve()
    subprocess.run(["rm", "-rf", str(out)])
    for k, v in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"), ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(k, v)
    s3 = S3Server()
    s3.client().create_bucket(Bucket="bench")
    cluster = LocalCluster(out / "cluster")
    cluster.up(workers=2, cpus=2, devices=1)
    platform = subprocess.Popen([sys.executable, str(ROOT / "deploy" / "local_cluster.py"), "--dir", str(cluster.dir),
                                 "platform", "--replace-after", str(args.replace_after), "--devices", "1"],
                                stdout=open(out / "platform.log", "w"), stderr=subprocess.STDOUT)
    run = out / "run"
    cmd = [sys.executable, "driver.py", *[a for k in KILLS for a in ("--chaos-kill-node", k)],
           f"trainer.run_dir={run}", f"data.dataset_dir={run}/data", "trainer.ckpt_path=s3://bench/ckpts",
           "trainer.export_path=s3://bench/exports", f"s3.endpoint_url={s3.url}", "data.train_size=40",
           "trainer.train_batch_size=4", "trainer.policy_mini_batch_size=4", "generator.n_samples_per_prompt=4",
           "data.eval_size=8", "trainer.eval_interval=5", "trainer.ckpt_interval=2", "trainer.max_ckpts_to_keep=-1",
           "trainer.placement.policy_num_nodes=2", "generator.inference_engine.num_engines=2",
           "trainer.placement.device_resource=visrl_device", "trainer.placement.cpus_per_bundle=1"]
    started = time.time()
    try:
        code = subprocess.call(cmd, cwd=ROOT, env=cluster.env(), stdout=open(out / "driver.log", "w"),
                               stderr=subprocess.STDOUT)
    finally:
        platform.terminate()
        platform.wait()
    wall = time.time() - started
    cluster.down()
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    chaos = [json.loads(line) for line in (run / "chaos.jsonl").read_text().splitlines()]
    records = [json.loads(line) for line in (run / "recoveries.jsonl").read_text().splitlines()]
    recoveries = [r for r in records if r["ok"]]
    backs = [r.get("back_to_step_s") for r in recoveries]
    store = Checkpointer("s3://bench/ckpts", S3Config(endpoint_url=s3.url))
    steps = store.steps()
    verified = all(store.verify(s) is None for s in steps)
    s3.stop()
    print(f"driver exit {code} in {wall:.0f}s; steps logged {[h['step'] for h in history]}")
    print(f"checkpoints {steps}, every one verifies: {verified}")
    print("| kill | phase@step | recovered | resumed from | steps lost | rebuild attempts | waited for the cluster | "
          "groups placed again -> next step finished |")
    print("|---|---|---|---|---|---|---|---|")
    attempts = [r["restart"] for r in records]
    for i, kill in enumerate(chaos):
        r = recoveries[i] if i < len(recoveries) else {}
        tries = attempts.count(r["restart"]) if r else 0
        back = f"{backs[i]:.0f} s" if i < len(backs) and backs[i] is not None else "-"
        print(f"| {i + 1} | {kill['phase']}@{kill['step']} | {'yes' if r else 'no'} | {r.get('resumed_from', '-')} | "
              f"{r.get('steps_lost', '-')} | {tries} | {r.get('placement_wait_s', 0):.0f} s | {back} |")
    once = [h["step"] for h in history] == list(range(len(history)))
    print(f"every step exactly once: {once}; kills {len(chaos)}, recovered {len(recoveries)}")


if __name__ == "__main__":
    main()
