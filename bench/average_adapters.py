"""Does the mean of a run's last adapters beat its final one? Post hoc, on tools/seeds.py's folders:
for each seed, the LoRA tensors of its last K exports (exports/global_step_N/policy) are averaged
and that adapter and the final export are evaluated greedily on the run's eval set and on --heldout.

    python bench/average_adapters.py --name stepw2 --seeds 42 0 1 2 --last 4
                                     [--heldout runs/heldout/eval.jsonl] [key=value ...]

Pass the overrides the seeds ran with (tools/seeds.py's), or the dataset check stops the eval.
A and B are averaged apart, as weight averages of one run's checkpoints do ("model soups",
stochastic weight averaging): the mean of the products BA would not be rank r any more. Late in a
run the adapters are close, which is when the two agree.
"""
import argparse
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from settings.load import parse_with_overrides  # noqa: E402
from tools.seeds import by_length, eval_adapter, seed_args  # noqa: E402


def average_adapters(adapters: list[Path], out: Path) -> Path:
    """Mean of the PEFT adapters' tensors, written as an adapter folder (the last one's config)."""
    tensors = [load_file(a / "adapter_model.safetensors") for a in adapters]
    for adapter, these in zip(adapters[1:], tensors[1:]):
        if these.keys() != tensors[0].keys() or any(these[k].shape != tensors[0][k].shape for k in these):
            raise SystemExit(f"{adapter} holds other LoRA tensors than {adapters[0]}: average the adapters of one run")
    mean = {k: torch.stack([t[k].float() for t in tensors]).mean(0).to(tensors[0][k].dtype) for k in tensors[0]}
    out.mkdir(parents=True, exist_ok=True)
    save_file(mean, out / "adapter_model.safetensors")
    shutil.copy(adapters[-1] / "adapter_config.json", out / "adapter_config.json")
    return out


def last_exports(folder: Path, k: int) -> list[Path]:
    exports = sorted(folder.glob("exports/global_step_*/policy"), key=lambda p: int(p.parent.name.split("_")[-1]))
    if len(exports) < k:
        raise SystemExit(f"{folder}/exports has {len(exports)} adapters, fewer than --last {k}")
    return exports[-k:]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--name", default="default", help="runs/seeds/<name>/")
    ap.add_argument("--config")
    ap.add_argument("--last", type=int, default=4, help="how many of the last exports to average")
    ap.add_argument("--heldout", metavar="FILE", help="also evaluate on this eval .jsonl")
    args = parse_with_overrides(ap, sys.argv[1:])
    sets = {"fixed": None, **({"held-out": args.heldout} if args.heldout else {})}
    print("| seed | adapter | " + " | ".join(sets) + " |\n|---|---|" + "---|" * len(sets))
    for seed in args.seeds:
        folder = ROOT / "runs" / "seeds" / args.name / f"seed_{seed}"
        exports = last_exports(folder, args.last)
        averaged = average_adapters(exports, folder / "averaged" / "policy")
        steps = ", ".join(p.parent.name.split("_")[-1] for p in exports)
        for label, adapter in ((f"final ({steps.split(', ')[-1]})", exports[-1]), (f"mean of {steps}", averaged)):
            cells = []
            for split, eval_set in sets.items():
                out = folder / "averaged" / f"{adapter.parent.name}_{split}"
                per_maze = eval_adapter(seed_args(seed, folder, args.config, args.overrides), adapter,
                                        eval_set or folder / "data" / "eval.jsonl", out, Path(f"{out}.log"))
                cells.append(f"{sum(m['solved'] for m in per_maze)}/{len(per_maze)} ({by_length(per_maze)})")
            print(f"| {seed} | {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
