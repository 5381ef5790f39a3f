"""A checkpoint at the reference's scale: its parts, their sizes, and the time to save and restore it,
to a folder and to a local S3 server (moto), on this machine's CPU.

    python bench/checkpoint_io.py [--shape 8b] [--rank 32] [--repeats 3] [--step-s 97] [--interval 20]

What a run's checkpoint holds at the 8B shape (Qwen3-VL-8B, LoRA rank 32 on every linear layer, the
vision tower's too, as configs/hyperpod_qwen3vl_8b.yaml): the adapter (PEFT safetensors, fp32: the
trainer keeps fp32 masters of the LoRA weights), the optimizer (AdamW's two moments of each LoRA
weight, the scheduler, the step count, the RNG) and trainer_state.json (the step, the adapter
version, the data position, the tracker ids). They are built from the model's config on the meta
device (no 16 GB of base weights), the optimizer's moments from one real AdamW step, and written by
the run's own Checkpointer. --step-s and --interval give the share of a run's time its saves take
(a step of the 8B decode workload took 97 s on one H200; the 8B config saves every 20 steps), which
says whether incremental checkpoints would pay.
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def lora_parameters(shape: str, rank: int) -> dict:
    """{PEFT name: fp32 tensor} of an all-linear LoRA of `shape`, random, as the trainer holds them."""
    import torch
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForImageTextToText

    from actors.policy_shard import lora_config
    from bench.gpu_scale import shape_config
    from vlm.processor import load_processor
    tokenizer = load_processor(str(ROOT / "assets" / "maze-vl-base")).tokenizer
    with torch.device("meta"):
        model = get_peft_model(AutoModelForImageTextToText.from_config(shape_config(shape, tokenizer)),
                               lora_config({"rank": rank, "alpha": rank, "dropout": 0.0, "target_modules": "all-linear"}))
    gen = torch.Generator().manual_seed(0)
    return {k: torch.randn(v.shape, generator=gen) * 0.01 for k, v in get_peft_model_state_dict(model).items()}, model


def policy_state(lora: dict) -> dict:
    """What FSDPPolicyShard.state_dict returns: AdamW's state after a step, the scheduler, the RNG."""
    import torch
    params = [torch.nn.Parameter(t.clone()) for t in lora.values()]
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "optimizer_steps": 1,
            "torch_rng": torch.get_rng_state()}


def sizes(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", choices=["2b", "8b"])
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step-s", type=float, default=97.0, help="seconds a training step takes")
    ap.add_argument("--interval", type=int, default=20, help="steps between checkpoints")
    args = ap.parse_args()
    import os

    from safetensors.torch import save_file

    from actors.checkpointer import Checkpointer
    from deploy.local_s3 import S3Server
    from settings.schema import S3Config
    for k, v in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"), ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(k, v)
    lora, model = lora_parameters(args.shape, args.rank)
    n = sum(t.numel() for t in lora.values())
    print(f"{args.shape}, LoRA r{args.rank} all-linear: {n / 1e6:.1f}M trainable parameters", flush=True)
    state = policy_state(lora)
    tmp = Path(tempfile.mkdtemp(prefix="visrl-ckpt-io-"))
    adapter = tmp / "adapter"
    adapter.mkdir()
    save_file(lora, str(adapter / "adapter_model.safetensors"))
    model.peft_config["default"].save_pretrained(str(adapter))
    trainer_state = {"global_step": 20, "adapter_version": 20, "total_steps": 160, "config": "...",
                     "sampler": {"epoch": 0, "cursor": 480, "replay": []}, "trackers": {"wandb": "abc123"}}
    s3 = S3Server()
    s3.client().create_bucket(Bucket="ckpts")
    rows = {}
    for where, ck in (("folder", Checkpointer(str(tmp / "ckpts"))),
                      ("local S3 (moto)", Checkpointer("s3://ckpts/run", S3Config(endpoint_url=s3.url)))):
        saves, restores = [], []
        for r in range(args.repeats):
            info = ck.save(20 + r, trainer_state, state, str(adapter))
            saves.append(info["seconds"])
            start = time.perf_counter()
            ck.load_policy_state(20 + r, str(tmp / f"restored-{r}"))
            ck.load_trainer_state(20 + r)
            restores.append(time.perf_counter() - start)
        rows[where] = {"bytes": info["bytes"], "save_s": statistics.median(saves), "restore_s": statistics.median(restores)}
        print(f"{where}: {json.dumps(rows[where])}", flush=True)
    s3.stop()
    parts = sizes(tmp / "ckpts" / f"global_step_{20 + args.repeats - 1}")
    print("\n| part | MiB |\n|---|---|")
    for name, size in parts.items():
        print(f"| {name} | {size / 2**20:.1f} |")
    print("\n| store | checkpoint | save (median) | restore (median) | share of a run's time (a save every "
          f"{args.interval} steps of {args.step_s:g} s) |\n|---|---|---|---|---|")
    for where, r in rows.items():
        share = r["save_s"] / (args.interval * args.step_s)
        print(f"| {where} | {r['bytes'] / 2**30:.2f} GiB | {r['save_s']:.1f} s | {r['restore_s']:.1f} s | {100 * share:.2f}% |")


if __name__ == "__main__":
    main()
