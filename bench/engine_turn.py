"""One rollout turn of the hf engine on a GPU, HF's dynamic KV cache against its static one.

    python bench/engine_turn.py [--shape 8b] [--episodes 64] [--repeats 3]

Builds a random-weight Qwen3-VL of the shape (bench/gpu_scale.py), then times `generate` for the
first turn of `--episodes` mazes at `environment.cell_px=32` (one picture of 81 tokens, 141-token
prompts), 16 sampled tokens, no adapter, alternating the two caches. The first call of each warms up.
With the static cache, transformers compiles the model's forward (CUDA graphs) on the first call
of every new shape: the first call is the price, the later ones the gain.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main():
    import torch

    from actors.vllm_engine import VLLMEngine
    from bench.gpu_scale import build
    from envs.maze import MazeEnv
    from envs.prompt import INSTRUCTION
    from inference.requests import GenRequest, Sampling
    from vlm.chat import ChatPrompter
    from vlm.processor import load_processor

    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="8b", choices=["2b", "8b"])
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="/tmp/engine-turn-model")
    args = ap.parse_args()
    build(args.shape, Path(args.out))
    prompter = ChatPrompter(load_processor(args.out).tokenizer, 81, INSTRUCTION)
    requests = []
    for seed in range(args.episodes):
        image, _ = MazeEnv(cell_px=32).reset(seed=seed)
        requests.append(GenRequest(prompt_ids=prompter.prompt([""], [], 1)[0], images=[image]))
    engine = VLLMEngine(args.out, backend="hf", device="cuda", dtype="bfloat16", threads=8)
    generate = engine.backend.model.generate
    sampling = Sampling(temperature=1.0, max_new_tokens=16, seed=1)
    for k, cache in enumerate(["dynamic", "static"] * (args.repeats + 1)):
        engine.backend.model.generate = (
            (lambda *a, **kw: generate(*a, cache_implementation="static", **kw)) if cache == "static" else generate)
        torch.cuda.synchronize()
        start = time.perf_counter()
        results = engine.generate(requests, sampling)
        torch.cuda.synchronize()
        tokens = sum(len(r.token_ids) for r in results)
        print(f"{cache} cache{' (first call)' if k < 2 else ''}: {time.perf_counter() - start:.2f} s, "
              f"{tokens} tokens, prompts of {len(requests[0].prompt_ids)}", flush=True)


if __name__ == "__main__":
    main()
