"""The GPU path at the reference scale: random-weight Qwen3-VL models of the 2B and 8B shapes, built
on the GPU, trained for a few steps by the real driver; one table of where the time and memory go.

    python bench/gpu_scale.py --shapes 2b 8b --steps 3 [--engines hf vllm] [--workloads short decode]
                              [--out runs/gpu_scale] [key=value ...]

Each shape is built straight on the GPU from its config (bf16, random weights: no download, no
weights carried), saved with the project's tokenizer and a Qwen3-VL processor with patch 16 and
merge 2 (so `environment.cell_px=32` gives 81 picture tokens), then `python driver.py` runs each
workload with each engine, one run after another on the same saved model: LoRA r32 on all linear
layers, 8 samples a prompt, 5 turns (15 for `reference`), KL on, old log-probs recomputed by the policy (so the
engine-vs-trainer gap is measured). Workloads: `short` (issue 14's: 8 prompts, 16 new tokens a
turn), `decode` (closer to the reference run's: 24 prompts, 128 new tokens a turn) and `reference` (one
engine's share of the reference run: 4 prompts x 8 samples, 15 turns, 256 new tokens a turn). Random
weights earn no reward: these runs measure time and memory, not learning.

Columns (means over the steps after the first, which warms up): phase seconds from timing/*,
generated and prompt+generated tokens a second, generate seconds of step 1 (the base, no adapter
yet) and of the later steps (with the adapter), train MFU = 4 x params x trained tokens / train
seconds / 989 TFLOP/s (the H200's dense bf16 peak; 4, not 6: the frozen base gets no weight
gradient), each GPU actor's peak memory (torch's max allocated, per process: their sum overstates
what is held at once when an engine sleeps; vLLM's engine core is another process, so its actor
reads ~0), the engine's own memory awake and asleep (NVML, its process tree), the device's peak as
nvidia-smi sees it (every process, CUDA contexts and allocator caches included, sampled twice a
second), the adapter load at each sync, and the engine-vs-trainer log-prob gap (mean |d| and k3).
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEAK_FLOPS = 989e12
SHAPES = {  # Qwen3-VL-2B / -8B (text, vision), as their configs give them
    "2b": ({"hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
            "intermediate_size": 6144, "tie_word_embeddings": True},
           {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16, "out_hidden_size": 2048,
            "deepstack_visual_indexes": [5, 11, 17]}),
    "8b": ({"hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 12288, "tie_word_embeddings": False},
           {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 4096,
            "deepstack_visual_indexes": [8, 16, 24]}),
}


def shape_config(shape: str, tokenizer):
    """The Qwen3VLConfig of `shape` with the project's tokenizer's ids."""
    from transformers import Qwen3VLConfig

    from vlm.build import special_token_ids
    text, vision = SHAPES[shape]
    text = dict(text)
    tie = text.pop("tie_word_embeddings")
    return Qwen3VLConfig(
        text_config=dict(vocab_size=151936, head_dim=128, max_position_embeddings=32768,
                         rope_parameters={"rope_type": "default", "rope_theta": 5_000_000.0,
                                          "mrope_section": [24, 20, 20], "mrope_interleaved": True},
                         tie_word_embeddings=tie, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         eos_token_id=tokenizer.eos_token_id, **text),
        vision_config=dict(patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                           **vision),
        tie_word_embeddings=tie, **special_token_ids(tokenizer))


def build(shape: str, out: Path) -> int:
    """Save a random bf16 model of `shape` to `out`; returns its parameter count."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from vlm import qwen3_vl
    from vlm.chat import CHAT_TEMPLATE
    from vlm.processor import ImageOnlyQwen3VLProcessor, load_processor

    tokenizer = load_processor(str(ROOT / "assets" / "maze-vl-base")).tokenizer
    config = shape_config(shape, tokenizer)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):  # built where it runs: no host copy of 16 GB of random numbers
        model = Qwen3VLForConditionalGeneration(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out)
    # Qwen3-VL's own picture preprocessing, so the shape's prompts carry the real model's picture tokens
    ImageOnlyQwen3VLProcessor(image_processor=qwen3_vl.image_processor(), tokenizer=tokenizer,
                              chat_template=CHAT_TEMPLATE).save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    torch.cuda.empty_cache()
    return n


WORKLOADS = {  # prompts a step (8 samples each), new tokens a turn, turns
    "short": (8, 16, 5),
    "decode": (24, 128, 5),
    # one engine's share of the reference run: 24 prompts x 8 samples over 6 engines, 15 turns; its
    # answers may run to 1,024 tokens, a random-weight model always does, so 256 stands for a long one
    "reference": (4, 256, 15),
}


def workload(model: Path, run: Path, steps: int, name: str = "short") -> list[str]:
    prompts, tokens, turns = WORKLOADS[name]
    return [f"trainer.policy.model.path={model}", f"trainer.run_dir={run}", f"trainer.ckpt_path={run}/ckpts",
            f"trainer.export_path={run}/exports", f"data.dataset_dir={run}/data", "trainer.device=cuda",
            "trainer.resume_mode=none", "trainer.epochs=1", f"data.train_size={prompts * steps}",
            f"trainer.train_batch_size={prompts}", f"trainer.policy_mini_batch_size={prompts}",
            "generator.n_samples_per_prompt=8", f"generator.max_turns={turns}", "data.solvable_only=false",
            f"generator.sampling_params.max_generate_length={tokens}",
            f"generator.eval_sampling_params.max_generate_length={tokens}", "environment.cell_px=32",
            "trainer.policy.model.lora.rank=32", "trainer.policy.model.lora.alpha=32",
            "trainer.policy.model.lora.target_modules=all-linear", "trainer.algorithm.use_kl_loss=true",
            "trainer.algorithm.use_rollout_logprobs=false", "trainer.algorithm.filter_zero_advantage_groups=false",
            "trainer.eval_before_train=false", "trainer.eval_interval=1000", "trainer.hf_save_interval=1000",
            "data.validation_size=0",
            f"trainer.ckpt_interval={steps}", "trainer.placement.cpus_per_bundle=8",
            "trainer.micro_forward_batch_size_per_gpu=16", "trainer.micro_train_batch_size_per_gpu=16"]


def profile_parser(doc: str, timed: str, out: str) -> argparse.ArgumentParser:
    """The command line the in-process profiles share (rollout_profile.py, train_profile.py)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="8b", choices=["2b", "8b", "default"],
                    help="default: the shipped base and configs/default.yaml's workload, on the GPU")
    ap.add_argument("--repeats", type=int, default=2, help=f"{timed} timed after one warm-up")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=out)
    ap.add_argument("overrides", nargs="*")
    return ap


def profile_config(args):
    """(the profile's folder, its config): the shape built once under --out (a second profile with
    other overrides reuses it), gpu_scale's one-step workload plus the overrides."""
    from settings.load import load_config
    out = Path(args.out)
    if args.shape == "default":
        return out, load_config(None, [f"trainer.run_dir={out}/run", f"data.dataset_dir={out}/run/data",
                                       "trainer.device=cuda", "trainer.resume_mode=none"] + list(args.overrides))
    if not (out / "model" / "config.json").exists():
        build(args.shape, out / "model")
    return out, load_config(None, workload(out / "model", out / "run", 1) + list(args.overrides))


class DeviceMemory:
    """The largest memory.used nvidia-smi reports for each GPU while the block runs, in GiB."""

    def __enter__(self):
        self.peak, self.done = {}, threading.Event()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while not self.done.wait(0.5):
            out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout
            for line in out.strip().splitlines():
                gpu, mib = (int(x) for x in line.split(","))
                self.peak[gpu] = max(self.peak.get(gpu, 0.0), mib / 1024)

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def summarize(label: str, params: int, history: list[dict], device_peak: dict) -> str:
    steady = [h for h in history if h["step"] > 1] or history

    def mean(key, rows=steady):
        vals = [h[key] for h in rows if key in h]
        return sum(vals) / len(vals) if vals else 0.0
    train_s, tokens = mean("timing/train"), mean("train/tokens")
    mfu = 4 * params * tokens / max(train_s, 1e-9) / PEAK_FLOPS
    phases = ["step", "wake", "generate", "sleep", "ref", "train", "sync", "ckpt"]
    timing = ", ".join(f"{p} {mean('timing/' + p):.1f}" for p in phases)
    other = mean("timing/step") - sum(mean("timing/" + p) for p in phases[1:])
    memory = {k.split("/")[1].replace("_peak_gib", ""): max(h.get(k, 0) for h in history)
              for k in history[-1] if k.startswith("memory/") and k.endswith("_peak_gib")}
    engine = " / ".join(f"{max(h.get(f'memory/engine_{w}_gib', 0) for h in history):.1f}" for w in ("awake", "asleep"))
    first = [h for h in history if h["step"] == 1]
    return (f"| {label} ({params / 1e9:.2f}B) | {timing}, other {other:.1f} s | "
            f"{mean('generate/tokens_per_s'):.0f} / {mean('generate/total_tokens_per_s'):.0f} | "
            f"{mean('timing/generate', first):.1f} / {mean('timing/generate'):.1f} | "
            f"{100 * mfu:.1f}% ({tokens:.0f} tokens) | "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(memory.items()))
            + f" (sum {sum(memory.values()):.1f}) | {engine} | "
            + ", ".join(f"GPU{g} {v:.1f}" for g, v in sorted(device_peak.items()))
            + f" | {mean('sync/adapter_load_s'):.2f} | {mean('policy/rollout_logprob_diff'):.2e} / "
              f"{mean('policy/rollout_k3'):.2e} |")


def main(argv=None):
    from settings.load import parse_with_overrides
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["2b", "8b"], choices=sorted(SHAPES))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--engines", nargs="+", default=["hf"], choices=["hf", "vllm"])
    ap.add_argument("--workloads", nargs="+", default=["short"], choices=sorted(WORKLOADS))
    ap.add_argument("--out", default="runs/gpu_scale")
    ap.add_argument("--keep-model", action="store_true", help="leave the built model under --out for a later call")
    ap.add_argument("overrides", nargs="*")
    args = parse_with_overrides(ap, argv)
    out = Path(args.out).resolve()
    rows = []
    for shape in args.shapes:
        model = out / f"model-{shape}"
        started = time.time()
        if not (model / "config.json").exists():
            build(shape, model)
        params = model_params(model)
        print(f"{shape}: {params / 1e9:.2f}B parameters, ready in {time.time() - started:.0f}s", flush=True)
        for name in args.workloads:
            for engine in args.engines:
                label = f"{shape} {name} {engine}"
                run = out / f"run-{shape}-{name}-{engine}"
                with DeviceMemory() as device:
                    code = subprocess.call([sys.executable, "driver.py", *workload(model, run, args.steps, name),
                                            f"generator.inference_engine.backend={engine}", *args.overrides],
                                           cwd=ROOT, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
                log = run / "metrics.jsonl"
                history = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
                if code != 0 or not history:
                    rows.append(f"| {label} | failed (exit {code}) |")
                    print(rows[-1], flush=True)
                    continue
                rows.append(summarize(label, params, history, device.peak))
                print(rows[-1], flush=True)
        if not args.keep_model:
            subprocess.call(["rm", "-rf", str(model)])  # 16 GB at 8B: the next shape needs the disk
    print("| shape, workload, engine | seconds a step (mean after step 1) | generated / prompt+generated tok/s | "
          "generate s, step 1 (base) / later (adapter) | train MFU (4 x N x tokens / 989 TFLOP/s) | "
          "peak GPU memory by actor, GiB | engine memory awake / asleep, GiB | device peak (nvidia-smi), GiB | "
          "adapter load s a sync | engine-vs-trainer log-prob gap (mean abs / k3) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


def model_params(model: Path) -> int:
    """The parameter count of a saved model, from its safetensors headers (nothing loaded)."""
    from safetensors import safe_open
    total = 0
    for f in model.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for key in st.keys():
                n = 1
                for d in st.get_slice(key).get_shape():
                    n *= d
                total += n
    return total


if __name__ == "__main__":
    main()
