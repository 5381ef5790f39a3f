"""How fast can the shipped base learn the maze from expert labels? An upper bound for RL.

    python bench/supervised_bound.py [--steps 120] [--modes lora full]

Continues supervised training of assets/maze-vl-base on BFS-expert turns (the same data and
chat format as stage B of sft.embedded_base, 64 turns a step) and prints the greedy solve rate on the SFT
validation mazes every 20 steps, with wall time, until it reaches 90% or runs out of steps.
`lora` trains the default config's LoRA (targets, rank, alpha, learning rate), as GRPO does;
`full` trains every weight at stage B's 1e-3. Every turn carries the right answer here, which is
more signal than GRPO's one reward per episode, so a curve GRPO cannot beat.
"""
import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    import torch
    from peft import get_peft_model

    from actors.policy_shard import lora_config
    from settings import load_config
    from sft.embedded_base import agent_stage
    from vlm.build import EmbeddedArch
    from vlm.load import load_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--modes", nargs="+", default=["lora", "full"], choices=["lora", "full"])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(None, [])
    policy = cfg.trainer.policy
    for mode in args.modes:
        model, processor = load_model(policy.model.path)
        lr = 1e-3
        if mode == "lora":
            for p in model.parameters():
                p.requires_grad_(False)
            model = get_peft_model(model, lora_config(asdict(policy.model.lora)))
            lr = policy.optimizer_config.lr
        model.train()
        torch.manual_seed(7)
        started = time.time()
        result = agent_stage(model, processor, EmbeddedArch(cell_px=cfg.environment.cell_px), cfg, args.steps, 64, lr,
                             seed=7, stop_at=0.9)
        print(json.dumps({"mode": mode, "lr": lr, "validation_by_step": result["validation_checks"],
                          "wall_s": round(time.time() - started, 1)}))


if __name__ == "__main__":
    main()
