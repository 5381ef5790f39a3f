"""Greedy multi-turn episodes through vLLM against the hf engine, on the same device and mazes.

    python bench/engine_agreement.py [--device cuda] [--mazes 64] [--adapters random DIR ...] [--out FILE]

Both engines play the eval mazes of configs/default.yaml greedily through `RolloutRunner`, with the
base and then with each adapter (`random`: an all-linear LoRA with non-zero weights, the vision
tower's layers included). Episodes are compared turn by turn. In bf16 two correct engines may
still part where the top two tokens are nearly tied (their kernels round differently): at each
episode's first differing token the hf model scores both engines' tokens in bf16 and in fp32, and
the margin (log-prob of hf's token minus vLLM's) says whether it was such a tie. Writes the
per-episode comparison as JSON lines to --out and prints a table.
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NEAR_TIE = 0.1  # nats: two tokens closer than this in fp32 may swap under bf16 rounding


def play(backend, cfg, device, rows, adapters):
    """{label: episodes} for the base and each adapter, on one engine of `backend`."""
    from actors.env_pool import EnvPool
    from actors.handles import EngineClient
    from actors.vllm_engine import VLLMEngine, engine_settings
    from inference.requests import Sampling
    from rl.inputs import make_prompters
    from rl.rollout import RolloutRunner, task_of
    from storage.adapters import AdapterRef
    from vlm.load import compute_dtype
    from vlm.processor import load_processor

    cfg.generator.inference_engine.backend = backend
    path = cfg.trainer.policy.model.path
    engine = VLLMEngine(path, device=device, dtype=compute_dtype(device), **engine_settings(cfg))
    env = EnvPool(cfg.environment.env_class, cfg.environment.cell_px, cfg.generator.max_turns)
    runner = RolloutRunner.from_config(cfg, EngineClient([engine]).generate, make_prompters(load_processor(path), cfg), env)
    greedy = Sampling(max_new_tokens=cfg.generator.eval_sampling_params.max_generate_length, temperature=0.0)
    out = {}
    for version, (label, folder) in enumerate([("base", None)] + adapters):
        if folder:
            engine.load_adapter(AdapterRef(folder, version))
        tasks = [task_of(r, f"e{i}", i) for i, r in enumerate(rows)]
        out[label] = runner.run(tasks, greedy, version)
    engine.sleep()  # the next engine gets the GPU
    return out


def first_difference(a, b):
    """(turn, token index) where two episodes first differ, or None."""
    for t, (ta, tb) in enumerate(zip(a.turns, b.turns)):
        if ta.response_ids != tb.response_ids:
            k = next((i for i, (x, y) in enumerate(zip(ta.response_ids, tb.response_ids)) if x != y),
                     min(len(ta.response_ids), len(tb.response_ids)))
            return t, k
    return None if len(a.turns) == len(b.turns) else (min(len(a.turns), len(b.turns)), 0)


def margins(models, processor, device, episode, turn, k, token_a, token_b):
    """{dtype: log p(token_a) - log p(token_b)} after the shared prefix, under the hf model in each dtype."""
    import torch

    from vlm.forward import TrainSeq, collate, sampled_logprobs
    t = episode.turns[turn]
    prefix = t.prompt_ids + t.response_ids[:k]
    images = [episode.images[j] for j in t.picture_turns]
    out = {}
    for name, (model, dtype) in models.items():
        seqs = [TrainSeq("x", prefix + [tok], [0] * len(prefix) + [1], [0.0] * (len(prefix) + 1), images)
                for tok in (token_a, token_b)]
        with torch.no_grad():
            logp, _ = sampled_logprobs(model, collate(seqs, processor, device, dtype))
        out[name] = float(logp[0] - logp[1])
    return out


def hf_models(path, adapter, device):
    """({"bf16": (model, dtype), "fp32": ...} with the adapter applied, processor): the scorers."""
    import torch
    from peft import PeftModel

    from vlm.load import load_model
    models, processor = {}, None
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        model, processor = load_model(path, device, dtype)
        if adapter:
            model = PeftModel.from_pretrained(model, adapter).to(device, dtype)
        models[name] = (model.eval(), dtype)
    return models, processor


def main():
    from bench.rollout_throughput import random_adapter
    from rl.inputs import load_datasets
    from settings import load_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--mazes", type=int, default=64)
    ap.add_argument("--adapters", nargs="*", default=["random"])
    ap.add_argument("--out", default="runs/engine_agreement.jsonl")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    cfg = load_config(None, ["trainer.run_dir=runs/engine_agreement", "data.dataset_dir=runs/engine_agreement/data",
                             f"data.eval_size={args.mazes}", *args.overrides])
    _, rows = load_datasets(cfg)
    adapters = [("random", random_adapter(cfg, tempfile.mkdtemp(prefix="agreement-"))) if a == "random"
                else (Path(a).parent.name + "/" + Path(a).name, a) for a in args.adapters]
    played = {backend: play(backend, cfg, args.device, rows, adapters) for backend in ("hf", "vllm")}

    print("| model | episodes identical | turns identical | solved hf / vllm | first differences: near-tie in fp32 "
          f"(< {NEAR_TIE} nats) / not |")
    print("|---|---|---|---|---|")
    with open(args.out, "w") as f:
        for label, folder in [("base", None)] + adapters:
            models, processor = hf_models(cfg.trainer.policy.model.path, folder, args.device)
            same_eps = same_turns = all_turns = ties = other = 0
            for a, b in zip(played["hf"][label], played["vllm"][label]):
                where = first_difference(a, b)
                turns = sum(ta.response_ids == tb.response_ids for ta, tb in zip(a.turns, b.turns))
                same_turns, all_turns = same_turns + turns, all_turns + max(len(a.turns), len(b.turns))
                record = {"model": label, "episode": a.episode_id, "hf_turns": len(a.turns), "vllm_turns": len(b.turns),
                          "hf_solved": a.solved, "vllm_solved": b.solved, "first_difference": where}
                if where is None:
                    same_eps += 1
                else:
                    turn, k = where
                    ra = a.turns[turn].response_ids if turn < len(a.turns) else []
                    rb = b.turns[turn].response_ids if turn < len(b.turns) else []
                    if k < len(ra) and k < len(rb):
                        record["margin"] = margins(models, processor, args.device, a, turn, k, ra[k], rb[k])
                        near = abs(record["margin"]["fp32"]) < NEAR_TIE
                        ties, other = ties + near, other + (not near)
                    else:  # one engine ended the answer (or the episode) where the other went on
                        other += 1
                f.write(json.dumps(record) + "\n")
            n = len(played["hf"][label])
            solved = [sum(e.solved for e in played[b][label]) for b in ("hf", "vllm")]
            print(f"| {label} | {same_eps}/{n} | {same_turns}/{all_turns} | {solved[0]} / {solved[1]} | {ties} / {other} |",
                  flush=True)
    print(f"per-episode comparison: {args.out}")


if __name__ == "__main__":
    main()
