"""Checkpoint save/restore times (local folder and a local S3 server) for the default config, and
recovery after an actor is killed: time from the kill to the next completed step, steps lost.

    python bench/recovery.py [--steps 4]

Each scenario runs the real driver (Ray, actors) on the default config, shortened: no evals, a
checkpoint every 2 steps. The chaos run SIGKILLs a random actor's process after step 3, one step
after the last checkpoint, so one completed step is lost and redone; the second also kills the
EnvPool while the first recovery rebuilds the actors.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def driver(args, env):
    out = subprocess.run([sys.executable, "driver.py", *args], cwd=ROOT, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return out.stdout


def history(run):
    return [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def main():
    from deploy.local_s3 import S3Server
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1"}
    tmp = Path(tempfile.mkdtemp(prefix="visrl-recovery-"))
    s3 = S3Server()
    s3.client().create_bucket(Bucket="ckpts")
    rows = []
    for label, ckpt, extra in (("local folder", str(tmp / "local" / "ckpts"), []),
                               ("local S3 (moto)", "s3://ckpts/bench", [f"s3.endpoint_url={s3.url}"])):
        run = tmp / label.split()[1]
        common = [f"trainer.run_dir={run}", f"trainer.ckpt_path={ckpt}", f"trainer.export_path={run}/exports",
                  "trainer.eval_before_train=false", "trainer.eval_interval=1000", "trainer.ckpt_interval=2",
                  "trainer.hf_save_interval=1000", f"data.dataset_dir={tmp}/data", *extra]
        driver(common + ["trainer.stop_after_step=2"], env)
        driver(common + ["trainer.stop_after_step=3"], env)  # resumes from step 2
        h = history(run)
        save = [x["ckpt/save_s"] for x in h if "ckpt/save_s" in x]
        restore = [x["ckpt/restore_s"] for x in h if "ckpt/restore_s" in x]
        size = [x["ckpt/bytes"] for x in h if "ckpt/bytes" in x][0]
        rows.append(f"| {label} | {1000 * sum(save) / len(save):.0f} ms | {1000 * restore[0]:.0f} ms | {size / 1e6:.2f} MB |")
    print("| checkpoint store | save (mean) | restore | size |")
    print("|---|---|---|---|")
    print("\n".join(rows))

    print()
    print("| scenario | killed | kill -> next completed step | rebuild attempts (s) | steps lost | typical step |")
    print("|---|---|---|---|---|---|")
    for label, extra in (("one kill", []), ("a second kill during the recovery", ["--chaos-in-recovery"])):
        run = tmp / ("chaos-" + label.split()[0])
        driver([f"trainer.run_dir={run}", f"trainer.ckpt_path={run}/ckpts", f"trainer.export_path={run}/exports",
                "trainer.eval_before_train=false", "trainer.eval_interval=1000", "trainer.ckpt_interval=2",
                "trainer.hf_save_interval=1000", f"data.dataset_dir={tmp}/data",
                f"trainer.stop_after_step={args.steps + 1}", "--chaos-kill-every", "3", *extra], env)
        kills = [json.loads(line) for line in (run / "chaos.jsonl").read_text().splitlines()]
        attempts = [json.loads(line) for line in (run / "recoveries.jsonl").read_text().splitlines()]
        h = history(run)
        after = min(x["time"] for x in h if x["time"] > kills[0]["time"])
        step_times = sorted(x["timing/step"] for x in h if x["step"] > 0)
        killed = ", ".join(f"{k['actor']} ({k['method']}, {k['note']})" for k in kills)
        rebuilds = " + ".join(f"{a['rebuild_s']:.1f}" + ("" if a["ok"] else " (failed)") for a in attempts)
        ok = [a for a in attempts if a["ok"]][0]
        print(f"| {label} | {killed} | {after - kills[0]['time']:.1f} s | {rebuilds} | {ok['steps_lost']} (resumed "
              f"from step {ok['resumed_from']}) | {step_times[len(step_times) // 2]:.1f} s |")
        steps = [x["step"] for x in h]
        assert steps == sorted(set(steps)), "metrics hold a step twice"
    s3.stop()


if __name__ == "__main__":
    main()
