"""What several test modules share: a tiny run's arguments and the driver as a subprocess, adapters
with random weights, rollout requests, FSDP items and workers, and chat bodies for the serve apps.
Test modules import from here (and conftest's fixtures), never from each other."""
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import requests
import torch
import torch.multiprocessing as mp
import yaml
from safetensors.torch import load_file

from envs.maze import MazeEnv
from inference.requests import GenRequest, Sampling
from net import free_port
from rl.algorithm import compute_advantages
from rl.batch import build_items
from rl.rollout import Episode, Turn
from serving.maze_client import data_url
from settings.schema import AlgorithmConfig
from vlm.forward import TrainSeq, score_seqs
from vlm.processor import load_processor

ROOT = Path(__file__).resolve().parent.parent


def make_adapter(model_dir, out_dir, seed, rank=4, scale=1.0, target_modules="all-linear"):
    """A PEFT LoRA adapter with random (non-zero) weights, so it changes the model's outputs."""
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from actors.policy_shard import lora_config
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    config = lora_config({"rank": rank, "alpha": 2 * rank, "dropout": 0.0, "target_modules": target_modules})
    config.init_lora_weights = False
    peft = get_peft_model(model, config)
    with torch.no_grad():
        for n, p in peft.named_parameters():
            if "lora_B" in n:
                p.mul_(scale)
    peft.save_pretrained(out_dir)
    return str(out_dir)


def logged_steps(run):
    """The steps in metrics.jsonl so far (while a run may be writing it)."""
    steps = []
    if (run / "metrics.jsonl").exists():
        for line in (run / "metrics.jsonl").read_text().splitlines():
            try:
                steps.append(json.loads(line)["step"])
            except ValueError:
                pass  # a line being written
    return steps


def signal_at_steps(proc, run, pid: int, schedule: list[tuple[int, int]], timeout_s: float) -> None:
    """Send process `pid` each signal of `schedule` [(step, signal)] once the run `proc` writes to `run`
    has logged that step (a store stopped, resumed or killed mid-run)."""
    deadline = time.monotonic() + timeout_s
    for step, action in schedule:
        while step not in logged_steps(run):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.05)
        os.kill(pid, action)


def tiny_run_args(model_dir, run):
    return [f"trainer.policy.model.path={model_dir}", f"trainer.run_dir={run}", f"data.dataset_dir={run}/data",
            "data.train_size=4", "data.eval_size=4", "data.validation_size=2", "data.solvable_only=false",
            "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=1", "trainer.epochs=1", "generator.n_samples_per_prompt=2",
            "generator.max_turns=3", f"trainer.export_path={run}/exports", f"trainer.ckpt_path={run}/ckpts",
            "trainer.hf_save_interval=1", "trainer.eval_interval=1", "trainer.placement.cpus_per_bundle=1",
            "trainer.algorithm.use_kl_loss=true",
            # a random tiny model rarely solves a maze: keep all-zero groups so every step trains
            "trainer.algorithm.filter_zero_advantage_groups=false"]


def short_run_args(run, model_dir: str | None = None):
    """One GRPO step of the shipped base (or `model_dir`) on two mazes, exported, with a validation set:
    a trained adapter in about a minute, for tests that publish and serve one."""
    return [f"trainer.run_dir={run}", f"data.dataset_dir={run}/data", f"trainer.export_path={run}/exports",
            f"trainer.ckpt_path={run}/ckpts", "data.train_size=2", "data.eval_size=6", "data.validation_size=2",
            "trainer.train_batch_size=2", "trainer.policy_mini_batch_size=2", "trainer.epochs=1",
            "generator.n_samples_per_prompt=2", "trainer.eval_before_train=false", "trainer.resume_mode=none",
            "trainer.algorithm.filter_zero_advantage_groups=false", "trainer.policy.optimizer_config.lr=0.01"] + \
        ([f"trainer.policy.model.path={model_dir}"] if model_dir else [])


def run_tool(name, args, timeout=600):
    """tools/<name>.py as a user runs it, from the checkout."""
    return subprocess.run([sys.executable, f"tools/{name}.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "RAY_AUTH_MODE": "disabled"})


def run_driver(args, timeout=600, env_extra=None):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", **(env_extra or {})}
    return subprocess.run([sys.executable, "driver.py", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def requests_for(prompter, seeds, feedbacks):
    reqs = []
    for seed, fb in zip(seeds, feedbacks):
        env = MazeEnv(cell_px=16)
        image, _ = env.reset(seed=seed)
        answer = prompter.tok.encode("<action>up</action>", add_special_tokens=False)
        ids, _ = prompter.prompt(["", fb], [answer], window=0 if fb else 1)
        n_images = 2 if fb else 1
        reqs.append(GenRequest(prompt_ids=ids, images=[image] * n_images))
    return reqs


def make_items(model_dir, prompts_per_minibatch=1):
    from actors.env_pool import EnvPool
    from envs.prompt import INSTRUCTION
    from vlm.chat import ChatPrompter
    from vlm.processor import load_processor
    tok = load_processor(model_dir).tokenizer
    prompter = ChatPrompter(tok, 81, INSTRUCTION)
    pool = EnvPool("maze_2d/easy", 16, 15)
    episodes = []
    for i in range(8):
        start = pool.reset([f"e{i}"], seeds=[i])[0]
        ep = Episode(f"e{i}", i // 4, i, reward=float(i % 3 == 0))
        ep.images.append(start["image"])
        answer = tok.encode("<action>" + ["up", "down", "left"][i % 3] + "</action>", add_special_tokens=False) + [2]
        ep.turns.append(Turn(prompter.prompt([""], [], 1)[0], answer, [-1.0] * len(answer), [0], ""))
        episodes.append(ep)
    adv = compute_advantages(AlgorithmConfig(), episodes)
    items = build_items(episodes, adv, prompts_per_minibatch=prompts_per_minibatch, reduction="token_mean")
    rng = np.random.default_rng(0)
    # a reference policy that differs a little, so the KL term has a gradient
    ref = {it.key: (it.seq.rollout_logprobs() + rng.normal(0, 0.1, it.n_scored)).astype(np.float32) for it in items}
    return {"items": items, "ref": ref}


def spawn_on_items(worker, world_size, model_dir, tmp_path, batch):
    """Run a tests.fsdp_worker function on `world_size` ranks over `batch` (make_items); returns its output folder."""
    items_path = tmp_path / "items.pkl"
    items_path.write_bytes(pickle.dumps(batch))
    out = tmp_path / f"{worker.__name__}-w{world_size}"
    out.mkdir()
    mp.start_processes(worker, args=(world_size, free_port(), model_dir, str(items_path), str(out)),
                       nprocs=world_size, start_method="spawn", join=True)
    return out


def train_with(world_size, model_dir, tmp_path, batch):
    from tests.fsdp_worker import run_rank
    out = spawn_on_items(run_rank, world_size, model_dir, tmp_path, batch)
    result = pickle.loads((out / "result.pkl").read_bytes())
    return result, load_file(str(out / "adapter" / "adapter_model.safetensors"))


def assert_trainer_agrees(engine, prompter, model_dir, device: str, atol: float) -> list:
    """Sample at temperature 0.7 and score the same tokens as the trainer does: the log-probs must
    agree (the behaviour policy the importance weights and the gap rest on). Returns the results."""
    reqs = requests_for(prompter, [6, 7, 8, 9], ["", "Moved left.", "", "Moved down."])
    results = engine.generate(reqs, Sampling(max_new_tokens=6, temperature=0.7, seed=3))
    seqs = [TrainSeq(f"s{i}", r.prompt_ids + res.token_ids, [0] * len(r.prompt_ids) + [1] * len(res.token_ids),
                     [0.0] * len(r.prompt_ids) + res.logprobs, r.images)
            for i, (r, res) in enumerate(zip(reqs, results))]
    scored = score_seqs(engine.backend.model, load_processor(model_dir), seqs, 4, device, torch.float32, 0.7)
    for seq, logp in zip(seqs, scored):
        np.testing.assert_allclose(logp, seq.rollout_logprobs(), atol=atol)
    return results


def png_data_url(seed=0, side=144, noise=True):
    rng = np.random.default_rng(seed)
    img = rng.integers(0, 255, (side, side, 3), dtype=np.uint8) if noise else np.full((side, side, 3), 200, np.uint8)
    return data_url(img)


def chat_body(model, image=True, **kw):
    content = [{"type": "text", "text": "Where next?"}]
    if image:
        content.append({"type": "image_url", "image_url": {"url": png_data_url()}})
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 6, "temperature": 0,
            **kw}


def fake_state(step):
    """A policy state shaped like FSDPPolicyShard.state_dict() (optimizer from a real AdamW)."""
    torch.manual_seed(step)
    p = torch.nn.Parameter(torch.randn(4, 3))
    opt = torch.optim.AdamW([p], lr=1e-3)
    p.grad = torch.randn(4, 3)
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0)
    return {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "optimizer_steps": step,
            "torch_rng": torch.get_rng_state()}


def fake_adapter(folder, step):
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"base_model.model.x.lora_A.weight": torch.full((2, 2), float(step))}, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    return str(folder)


def save_fake_checkpoint(ck, step, tmp_path):
    """A checkpoint of `step` with a fake policy state and adapter (tests of the Checkpointer)."""
    return ck.save(step, {"global_step": step, "sampler": {"epoch": 0, "cursor": step}}, fake_state(step),
                   fake_adapter(tmp_path / f"adapter{step}", step))


EMBEDDED_BASE = str(ROOT / "assets" / "maze-vl-base")


class Prometheus:
    """deploy/prometheus/prometheus.yml as shipped, pointed at this cluster's discovery file, scraping
    every second; on 127.0.0.1 and a free port, its data in a temp folder."""

    def __init__(self, discovery_file: str, folder: Path):
        config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
        config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(ROOT / "deploy" / "prometheus" / f) for f in config["rule_files"]]
        (job,) = config["scrape_configs"]
        job["file_sd_configs"][0]["files"] = [discovery_file]
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(folder / "prometheus.log", "wb")
        self.proc = subprocess.Popen(["prometheus", f"--config.file={folder / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={folder / 'data'}",
                                      f"--web.listen-address={self.url.removeprefix('http://')}"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(self.url + "/-/ready", timeout=1).ok:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"Prometheus did not start: {(folder / 'prometheus.log').read_text()[-2000:]}")

    def api(self, path: str, **params) -> dict:
        answer = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=30).json()
        assert answer["status"] == "success", answer
        return answer["data"]

    def query(self, expr: str) -> list:
        return self.api("query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float) -> list:
        return self.api("query_range", query=expr, start=start, end=end, step=2)["result"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def poll(prometheus: "Prometheus", expr: str, timeout_s: float = 60) -> list:
    """Ray's processes report their metrics to their node's agent every few seconds: wait for them."""
    deadline = time.monotonic() + timeout_s
    while not (found := prometheus.query(expr)) and time.monotonic() < deadline:
        time.sleep(1)
    return found
