"""A predicted step of the reference run for each sharding design, over a table of links, and its cost.

    python bench/step_model.py                                  # the reference: 3 nodes x 2 GPUs, 160 steps
    python bench/step_model.py --measured /tmp/comm/comm.json   # first check the byte model against bench/comm.py
    python bench/step_model.py --rate 4.10 --tokens-per-seq 6000

Bytes: what bench/comm.py counts, written as formulas in the shapes that set them. A policy shard
gathers every unit (each block, and the root: embeddings, output layer, the vision tower's ends) in
each forward, and every unit but the root again in backward (FSDP2 keeps the root gathered), and
reduces the LoRA gradients once a mini-batch (after its last micro-batch). With F forwards (trained
and scored micro-batches), T backwards (trained ones) and R mini-batches a step, the base's bytes B
and its root's C (bf16 on a GPU), the LoRA weights' fp32 bytes L (their gradients reduce in fp32;
they are gathered in the compute dtype, L/2), a gather moves W = F (B + L/2) + T (B + L/2 - C) a step.
With n shards, g a shard group and r = n / g groups, one rank sends a step:

    full shard (-1)      all-gather W (n-1)/n and reduce-scatter R L (n-1)/n, in a ring over every node
    hybrid (g = a node)  inside the node W (g-1)/g + R L (g-1)/g; across nodes all-reduce R 2 (L/g)(r-1)/r
    base whole (1)       across nodes all-reduce R 2 L (n-1)/n

A ring over several nodes is as slow as its node-to-node hops, each of which carries what one rank
sends. Time: bytes over each link's bandwidth, added to the compute (no overlap: the upper bound) or
hidden behind the training compute (full overlap: the lower bound); the table gives both.

Schedules (issue 52): with the base whole, the step's compute is split into generate (G s) and
train (T s) on each of the n GPUs. Colocated and synchronous a step takes G + T; one-step-off with
both awake on every GPU at best max(G, T) (if the two did not slow each other on a GPU: a bound, not
a measurement); separate pools of e engine GPUs and t shard GPUs take G n/e + T n/t in turn, or
max(G n/e, T n/t) one-step-off. The second table gives each, with its GPU-hours.

Compute (one H200, bench/README.md "The 8B shape on one GPU"): training at the measured 33% MFU of
989 TFLOP/s bf16, 6 x 8.77B FLOPs a trained token (forward, backward through activations, gradient
checkpointing's second forward), 2 x 8.77B a scored one; generation at the measured 6,088 tokens/s
a GPU (vLLM, 24 prompts x 8 x 5 turns x 128 tokens). The reference's tokens are not measured here:
--tokens-per-seq (a whole 15-turn episode, pictures included) and --answer-tokens (a turn's answer)
are assumptions, printed with the table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PARAMS_8B = 8.77e9               # bench/gpu_scale.py's 8B shape (Qwen3-VL-8B's sizes)
BASE_BYTES_8B = PARAMS_8B * 2    # bf16
ROOT_BYTES_8B = 2 * 151936 * 4096 * 2  # untied embeddings and output layer in bf16 (the vision ends' ~1% left out)
LORA_BYTES_8B_R32 = 400.6 * 2**20  # the r32 adapter in fp32 (bench/checkpoint_io.py)
PEAK_FLOPS, TRAIN_MFU, GEN_TOKENS_PER_S = 989e12, 0.33, 6088.0
GB = 1e9
NODE_LINKS = {"25 Gb/s": 25 / 8 * GB, "100 Gb/s": 100 / 8 * GB, "400 Gb/s": 400 / 8 * GB,
              "EFA, 3,200 Gb/s a node (p5)": 3200 / 8 * GB}
GPU_LINKS = {"PCIe 5.0 x16 (~40 GB/s)": 40 * GB, "NVLink (~300 GB/s)": 300 * GB}
DESIGNS = {-1: "full shard", 2: "hybrid", 1: "base whole"}


def passes(cfg) -> dict:
    """Micro-batches a policy shard runs a step: trained, and scored (reference, old policy)."""
    t, a = cfg.trainer, cfg.trainer.algorithm
    p = t.placement
    shards = p.policy_num_nodes * p.policy_num_gpus_per_node
    seqs = t.train_batch_size * cfg.generator.n_samples_per_prompt // shards  # one sequence an episode
    train = -(-seqs // t.micro_train_batch_size_per_gpu) * t.update_epochs_per_batch
    minibatches = t.train_batch_size // t.policy_mini_batch_size
    scored = 0
    if a.use_kl_loss and t.ref.from_policy_base:
        scored += -(-seqs // t.micro_forward_batch_size_per_gpu)
    if not a.use_rollout_logprobs:  # the old policy, for every mini-batch after the first
        scored += -(-(seqs - seqs // minibatches) // t.micro_forward_batch_size_per_gpu)
    # gradients cross once a mini-batch, after its last micro-batch (actors/policy_shard.py)
    return {"shards": shards, "per_node": p.policy_num_gpus_per_node, "seqs": seqs, "train": train,
            "scored": scored, "forwards": train + scored, "reductions": minibatches * t.update_epochs_per_batch}


def gathered_bytes(forwards: int, backwards: int, base: float, root: float, lora_gathered: float) -> float:
    """What one step's gathers move in all (the W of the module's docstring), before the ring's share."""
    return forwards * (base + lora_gathered) + backwards * (base + lora_gathered - root)


def design_bytes(fsdp: int, n: int, per_node: int, gathered: float, lora: float, reductions: int) -> dict:
    """Bytes one rank sends a step: {"inside": within a node, "across": on the node-to-node links}."""
    if fsdp == -1:
        ring = gathered * (n - 1) / n + reductions * lora * (n - 1) / n
        return {"inside": 0.0, "across": ring} if n > per_node else {"inside": ring, "across": 0.0}
    if fsdp == 1:
        return {"inside": 0.0, "across": reductions * 2 * lora * (n - 1) / n}
    g, r = fsdp, n // fsdp
    return {"inside": gathered * (g - 1) / g + reductions * lora * (g - 1) / g,
            "across": reductions * 2 * (lora / g) * (r - 1) / r}


def compute_seconds(p: dict, tokens_per_seq: float, answer_tokens: float, turns: int) -> dict:
    trained = p["seqs"] * tokens_per_seq
    train = (6 * PARAMS_8B * trained + 2 * PARAMS_8B * trained * p["scored"] / max(p["train"], 1)) \
        / (TRAIN_MFU * PEAK_FLOPS)
    generate = p["seqs"] * turns * answer_tokens / GEN_TOKENS_PER_S  # one engine a GPU, its share of episodes
    return {"train": train, "generate": generate}


def schedules(generate: float, train: float, gpus: int) -> list[tuple[str, int, float]]:
    """(schedule, GPUs held, seconds a step) for `gpus` GPUs whose step computes `generate` then `train`
    seconds on each of them, colocated or in separate pools of engine and shard GPUs."""
    rows = [("colocated, synchronous", gpus, generate + train),
            ("colocated, one-step-off (both awake; a bound)", gpus, max(generate, train))]
    for engines in range(1, gpus // 2 + 1):
        g, t = generate * gpus / engines, train * gpus / (gpus - engines)
        rows.append((f"separate {gpus - engines} + {engines}, synchronous", gpus, g + t))
        rows.append((f"separate {gpus - engines} + {engines}, one-step-off", gpus, max(g, t)))
    for engines in (1, 2):  # engine GPUs added beside the shards' own
        rows.append((f"{gpus} shard GPUs + {engines} engine GPUs, one-step-off", gpus + engines,
                     max(generate * gpus / engines, train)))
    return rows


def check_against(measured_path: Path) -> None:
    """The formulas against bench/comm.py's counts on the local cluster (fp32 there: a gather moves
    the LoRA weights whole), the micro-batches read off the full shard's reduce-scatters."""
    m = json.loads(measured_path.read_text())
    base, root, lora, n, per_node = m["base_bytes"], m["root_bytes"], m["lora_bytes"], m["shards"], m["per_node"]
    reductions = round(m["designs"]["-1"]["comm/world/reduce_scatter_bytes"] / (lora * (n - 1) / n))
    gathered = gathered_bytes(reductions, reductions, base, root, lora)  # no scoring pass in that run
    print(f"read off the full shard's counts: {reductions} trained micro-batch(es) a step, nothing scored")
    for fsdp, got in m["designs"].items():
        want = design_bytes(int(fsdp), n, per_node, gathered, lora, reductions)
        have = got["comm/total_bytes"] - got.get("comm/world/all_reduce_bytes", 0)  # less the step's statistics
        print(f"fsdp_size={fsdp}: predicted {(want['inside'] + want['across']) / 2**20:.3f} MiB a step, "
              f"measured {have / 2**20:.3f} MiB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "hyperpod_qwen3vl_8b.yaml"))
    ap.add_argument("--steps", type=int, default=160, help="the reference run's steps")
    ap.add_argument("--tokens-per-seq", type=float, default=4000, help="a whole episode's tokens (assumed)")
    ap.add_argument("--answer-tokens", type=float, default=100, help="a turn's generated tokens (assumed)")
    ap.add_argument("--rate", type=float, help="$ per GPU-hour, for a cost column")
    ap.add_argument("--measured", type=Path, help="bench/comm.py's comm.json: check the byte model first")
    args = ap.parse_args(argv)
    if args.measured:
        check_against(args.measured)
    from settings import load_config
    cfg = load_config(args.config, ["trainer.ckpt_path=s3://b/c", "trainer.export_path=/tmp/e"])
    p = passes(cfg)
    c = compute_seconds(p, args.tokens_per_seq, args.answer_tokens, cfg.generator.max_turns)
    print(f"the reference: {p['shards']} shards ({p['per_node']} a node), {p['seqs']} sequences a shard a step; "
          f"{p['train']} trained and {p['scored']} scored micro-batches; assumed {args.tokens_per_seq:g} tokens a "
          f"sequence, {args.answer_tokens:g} a turn's answer; "
          f"compute a step: generate {c['generate']:.1f} s, train {c['train']:.1f} s (one H200's rates)")
    designs = {-1: -1, 2: p["per_node"], 1: 1}
    head = "| node link | GPU link | " + " | ".join(f"{DESIGNS[d]} (`fsdp_size={v}`)" for d, v in designs.items()) + " |"
    print(head + "\n" + "|---" * (len(designs) + 2) + "|")
    best = {}
    for node_name, node_bw in NODE_LINKS.items():
        for gpu_name, gpu_bw in GPU_LINKS.items():
            cells = []
            for d, fsdp in designs.items():
                gathered = gathered_bytes(p["forwards"], p["train"], BASE_BYTES_8B, ROOT_BYTES_8B,
                                          LORA_BYTES_8B_R32 / 2)
                b = design_bytes(fsdp, p["shards"], p["per_node"], gathered, LORA_BYTES_8B_R32, p["reductions"])
                comm = b["inside"] / gpu_bw + b["across"] / node_bw
                slow = c["generate"] + c["train"] + comm
                fast = c["generate"] + max(c["train"], comm)
                hours = p["shards"] * args.steps * slow / 3600
                cost = f", ${hours * args.rate:,.0f}" if args.rate else ""
                cells.append(f"{fast:.0f}-{slow:.0f} s, {b['across'] / GB:.1f} GB across; {hours:.0f} GPU-h{cost}")
                best.setdefault((node_name, gpu_name), []).append((slow, fsdp))
            print(f"| {node_name} | {gpu_name} | " + " | ".join(cells) + " |")
    picks = {min(v)[1] for v in best.values()}
    print(f"fastest design (upper bound) on every link pair: fsdp_size={sorted(picks)}")
    print(f"\nschedules, the base whole (its bytes left out), {args.steps} steps:\n"
          "| schedule | GPUs | s a step | GPU-h |\n|---|---|---|---|")
    for name, gpus, step in schedules(c["generate"], c["train"], p["shards"]):
        hours = gpus * args.steps * step / 3600
        print(f"| {name} | {gpus} | {step:.1f} | {hours:.1f}" + (f" (${hours * args.rate:,.0f})" if args.rate else "") + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
