"""Serve app latency, adapter cold load from a local S3 server, and throughput under load.

    python bench/serve_bench.py [--requests 60] [--clients 32] [--adapters 4]
    .venv-vllm/bin/python bench/serve_bench.py --backends hf vllm

Starts Ray Serve on 127.0.0.1 with the shipped base model, makes 4 LoRA adapters (random
weights, rank 16, the language layers: the shape a training run exports), puts them on a moto S3
server, and measures over real HTTP with maze pictures: p50/p95 latency for the base and a warm
adapter, the cold load of an adapter from S3, and throughput with 32 concurrent clients spread
over 4 adapters (with the error count). With --backends hf vllm, the same for the hf server and
for ray.serve.llm on vLLM, one after the other in one Ray cluster. With --trained FOLDER, that
adapter goes to the S3 server too and each app plays --mazes eval mazes greedily through the openai
client, with the base and with the adapter: solved counts, and how many move sequences the apps share.
With --backends vllm-server, vLLM's own OpenAI server (what ray.serve.llm runs in its replicas) as a
subprocess, the adapters synced from the S3 server to a local folder first: for a machine whose vLLM
is older than the one Ray's serve code imports (vLLM 0.26 on the H200 image's torch 2.11).
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_adapters(base: str, out: Path, n: int) -> list[str]:
    """n random adapters of the default config's shape (rank 16 on the language layers)."""
    from bench.rollout_throughput import random_adapter
    from settings import load_config
    cfg = load_config(None, [f"trainer.policy.model.path={base}"])
    return [Path(random_adapter(cfg, str(out / f"adapter{i}"), seed=i)).name for i in range(n)]


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    import os

    import ray
    from ray import serve

    from envs.maze import MazeEnv
    from serve_app import app
    from serving.maze_client import data_url
    from storage.adapters import ADAPTER_FILES
    from tests.conftest import S3Server

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--backends", nargs="+", default=["hf"], choices=["hf", "vllm", "vllm-server"],
                    help="vllm: ray.serve.llm (run with .venv-vllm/bin/python); vllm-server: vLLM's own server")
    ap.add_argument("--trained", help="a trained adapter folder (a run's exports/global_step_N/policy)")
    ap.add_argument("--mazes", type=int, default=16, help="eval mazes each app plays with --trained")
    args = ap.parse_args()
    for k, v in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"), ("AWS_DEFAULT_REGION", "us-east-1"),
                 ("RAY_AUTH_MODE", "disabled")):
        os.environ.setdefault(k, v)
    base = str(ROOT / "assets" / "maze-vl-base")
    tmp = Path(tempfile.mkdtemp(prefix="visrl-serve-bench-"))
    names = make_adapters(base, tmp / "adapters", args.adapters)
    folders = {name: tmp / "adapters" / name for name in names}
    if args.trained:
        folders["trained"] = Path(args.trained)
    s3 = S3Server()
    client = s3.client()
    client.create_bucket(Bucket="adapters")
    for name, folder in folders.items():
        for f in ADAPTER_FILES:
            client.upload_file(str(folder / f), "adapters", f"bench/{name}/{f}")
    env = MazeEnv(cell_px=16)
    image, _ = env.reset(seed=7)
    url = data_url(image)

    def body(model):
        return {"model": model, "temperature": 0, "max_tokens": 8, "messages": [
            {"role": "user", "content": [{"type": "text", "text": ""}, {"type": "image_url", "image_url": {"url": url}}]}]}

    # ray.serve.llm's router, server replica and engine bundle need logical CPUs beyond the cores
    ray.init(namespace="visrl-serve-bench", include_dashboard=False, num_cpus=max(8, os.cpu_count() or 1))
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    settings = {"base_model": base, "dynamic_lora_loading_path": "s3://adapters/bench", "s3_endpoint_url": s3.url,
                "max_loras": str(args.adapters), "max_lora_rank": "16", "num_cpus": "2"}
    gpu = {"num_gpus": "1"} if ray.cluster_resources().get("GPU") else {}  # the hf server's replica on the GPU
    base_id = "maze-vl-base"
    rows, episodes = {}, {}
    for backend in args.backends:  # one app at a time, the other idle: they share the cores
        if backend == "vllm-server":
            server, root = start_vllm_server(base, base_id, list(folders), client, tmp, args.port + 1, args.adapters)
        else:
            hf_only = {"cache_dir": str(tmp / "cache"), **gpu} if backend == "hf" else {}
            serve.run(app({**settings, "backend": backend, **hf_only}), name=backend, route_prefix=f"/{backend}")
            root = f"http://127.0.0.1:{args.port}/{backend}"
        rows[backend] = measure(root, base_id, names, body, args)
        if args.trained:
            episodes[backend] = play_mazes(f"{root}/v1", base_id, tmp, args.mazes)
            rows[backend] |= {f"{who}: eval mazes solved (of {args.mazes}, openai client, greedy)":
                              str(sum(e["solved"] for e in eps)) for who, eps in episodes[backend].items()}
        print(f"{backend}: {rows[backend]}", flush=True)  # each app's figures as soon as it is measured
        if backend == "vllm-server":
            server.terminate()
            server.wait(60)
        else:
            serve.delete(backend)
    if len(episodes) == 2:
        a, b = episodes.values()
        for who in a:
            same = str(sum(x["answers"] == y["answers"] for x, y in zip(a[who], b[who])))
            for backend in args.backends:
                rows[backend][f"{who}: move sequences identical across the apps"] = same
    print("| measure | " + " | ".join(args.backends) + " |")
    print("|---" * (len(args.backends) + 1) + "|")
    for key in rows[args.backends[0]]:
        print(f"| {key} | " + " | ".join(rows[b][key] for b in args.backends) + " |")
    serve.shutdown()
    ray.shutdown()
    s3.stop()


def start_vllm_server(base: str, base_id: str, names: list[str], s3_client, tmp: Path, port: int,
                      max_loras: int) -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server on 127.0.0.1 with the engine arguments the serve app gives ray.serve.llm;
    each adapter downloaded from the S3 server and served as `base_id:name`."""
    import os

    import requests
    import torch

    from inference.vllm_backend import cpu_env, engine_kwargs
    from storage.adapters import ADAPTER_FILES
    on_cpu = not torch.cuda.is_available()
    modules = []
    for name in names:
        folder = tmp / "synced" / name
        folder.mkdir(parents=True)
        for f in ADAPTER_FILES:
            s3_client.download_file("adapters", f"bench/{name}/{f}", str(folder / f))
        modules.append(json.dumps({"name": f"{base_id}:{name}", "path": str(folder), "base_model_name": base_id}))
    options = ({"model": base, "served_model_name": base_id, "host": "127.0.0.1", "port": port, "max_model_len": 4096}
               | ({"dtype": "float32"} if on_cpu else {"dtype": "bfloat16", "gpu_memory_utilization": 0.45})
               | engine_kwargs(on_cpu, 16, max_loras))
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *cli_flags(options),
                               "--lora-modules", *modules], env=os.environ | (cpu_env(2) if on_cpu else {}))
    root = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vLLM's server exited with {server.returncode} before it answered")
        try:
            if requests.get(f"{root}/health", timeout=5).ok:
                return server, root
        except requests.ConnectionError:
            pass
        time.sleep(2)
    server.kill()
    raise RuntimeError("vLLM's server did not answer /health within 600 s")


def cli_flags(options: dict) -> list[str]:
    """Engine arguments as vLLM's command line takes them: booleans as --name / --no-name."""
    flags = []
    for key, value in options.items():
        name = key.replace("_", "-")
        flags += [f"--{name}"] if value is True else [f"--no-{name}"] if value is False else [f"--{name}", str(value)]
    return flags


def play_mazes(base_url: str, base_id: str, tmp: Path, n: int) -> dict:
    """Greedy episodes on the first n eval mazes of the default config, base and trained adapter."""
    from rl.inputs import load_datasets
    from serving.maze_client import openai_chat, play_as_configured
    from settings import load_config
    cfg = load_config(None, [f"data.dataset_dir={tmp / 'data'}"])
    chat, eval_rows = openai_chat(base_url), load_datasets(cfg)[1][:n]
    return {who: [play_as_configured(chat, model, r, cfg) for r in eval_rows]
            for who, model in (("base", base_id), ("trained adapter", f"{base_id}:trained"))}


def measure(root: str, base_id: str, names: list[str], body, args) -> dict:
    import requests
    session = requests.Session()

    def call(model, s=session):
        start = time.perf_counter()
        r = s.post(f"{root}/v1/chat/completions", json=body(model), timeout=300)
        return time.perf_counter() - start, r.status_code

    call(base_id)  # warm-up
    base_lat = [call(base_id)[0] for _ in range(args.requests)]
    cold_s, _ = call(f"{base_id}:{names[0]}")
    stats = session.get(f"{root}/v1/adapters/stats", timeout=30)  # the hf server's own bookkeeping
    server_load = stats.json()["load_seconds"][names[0]] if stats.ok else None
    warm_lat = [call(f"{base_id}:{names[0]}")[0] for _ in range(args.requests)]
    for n in names[1:]:
        call(f"{base_id}:{n}")  # resident before the load test
    models = [f"{base_id}:{names[i % len(names)]}" for i in range(args.clients * 10)]

    def worker(model):
        with requests.Session() as s:
            return call(model, s)

    start = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        results = list(pool.map(worker, models))
    wall = time.perf_counter() - start
    load_lat = [t for t, _ in results]

    def p50_p95(xs):
        return f"{1000 * statistics.median(xs):.0f} ms / {1000 * percentile(xs, 0.95):.0f} ms"

    return {f"base latency p50 / p95 (1 client, {args.requests} requests)": p50_p95(base_lat),
            "warm adapter latency p50 / p95": p50_p95(warm_lat),
            "adapter cold load from local S3 (download + apply, server side)":
                f"{1000 * server_load:.0f} ms" if server_load is not None else "not reported",
            "first request on a cold adapter (client side)": f"{1000 * cold_s:.0f} ms",
            f"throughput, {args.clients} clients over {len(names)} adapters, {len(models)} requests":
                f"{len(models) / wall:.1f} req/s, p50 {1000 * statistics.median(load_lat):.0f} ms, "
                f"p95 {1000 * percentile(load_lat, 0.95):.0f} ms, errors {sum(code != 200 for _, code in results)}"}


if __name__ == "__main__":
    main()
