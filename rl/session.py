"""A training run's state and phases, so driver.py can read like the one-line flow.

The session owns the config, the data, the actors (through their handles) and the adapter
version. Sampling and training are separate clients: rollouts go through EngineClient, updates
through the policy shards, and the only thing that crosses between them is a versioned adapter
folder on shared storage.
"""
from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import numpy as np
from ray.exceptions import ActorUnavailableError, RayActorError

from actors.handles import EngineClient, Sync, call_all
from envs.dataset import load_rows, write_dataset
from envs.prompt import INSTRUCTION
from inference.requests import Sampling
from rl.algorithm import compute_advantages
from rl.batch import build_items, split_for_ranks
from rl.evaluate import EvalReport, evaluate
from rl.metrics import eval_metrics, rollout_metrics
from rl.rollout import RolloutRunner, Task
from rl.sampler import PromptSampler
from settings.load import to_yaml
from telemetry.run_log import RunLog
from telemetry.timing import Phases
from vlm.chat import ChatPrompter

# What an actor's death looks like to the driver (a crashed, killed or unreachable actor).
ACTOR_FAILURES = (RayActorError, ActorUnavailableError)


def resolve_device(cfg) -> str:
    if cfg.trainer.device != "auto":
        return cfg.trainer.device
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_datasets(cfg, eval_set: str | None = None) -> tuple[list[dict], list[dict]]:
    """The run's train and eval rows; written first if the dataset folder is empty."""
    d = Path(cfg.data.dataset_dir)
    if not (d / "manifest.json").exists():
        write_dataset(d, cfg.environment.env_class, cfg.data.train_size, cfg.data.eval_size, cfg.data.train_seed_start,
                      cfg.data.eval_seed_start, cfg.generator.max_turns, cfg.data.solvable_only)
    train_rows = load_rows(d / "train.jsonl")
    eval_rows = load_rows(eval_set or cfg.data.eval_set or d / "eval.jsonl")
    env_ids = {r["env_id"] for r in train_rows + eval_rows}
    if env_ids != {cfg.environment.env_class}:
        raise ValueError(f"dataset in {d} holds {sorted(env_ids)} but environment.env_class is "
                         f"{cfg.environment.env_class}; point data.dataset_dir elsewhere or remake it")
    return train_rows, eval_rows


def make_prompter(processor, cfg) -> ChatPrompter:
    from envs.maze import SIZES
    side = SIZES[cfg.environment.env_class] * cfg.environment.cell_px
    enc = processor.image_processor(images=[np.zeros((side, side, 3), np.uint8)], return_tensors="np")
    merge = getattr(processor.image_processor, "merge_size", 1)
    n_tokens = int(np.prod(enc["image_grid_thw"][0]) // (merge * merge))
    return ChatPrompter(processor.tokenizer, n_tokens, INSTRUCTION)


def eval_sampling(cfg) -> Sampling:
    return Sampling(max_new_tokens=cfg.generator.eval_sampling_params.max_generate_length,
                    temperature=cfg.generator.eval_sampling_params.temperature)


class Session:
    def __init__(self, cfg):
        from vlm.load import resolve_model_path
        from vlm.processor import load_processor

        self.cfg, self.device = cfg, resolve_device(cfg)
        t = cfg.trainer
        self.run_dir = Path(t.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(to_yaml(cfg))
        self.train_rows, self.eval_rows = load_datasets(cfg)
        self.processor = load_processor(resolve_model_path(t.policy.model.path, cfg.s3))
        self.prompter = make_prompter(self.processor, cfg)
        self.sampler = PromptSampler(self.train_rows, t.train_batch_size, t.seed)
        self.total_steps = t.epochs * self.sampler.steps_per_epoch
        self.step, self.version = 0, 0
        self.adapter_dir = None
        self.phases = Phases()
        self.actors = None
        self.log_file = None
        self.restarts = 0
        self.recoveries: list[dict] = []
        self.chaos_kills = 0
        self.chaos_steps: set[int] = set()
        self.pending_metrics: dict = {}  # reported with the next logged step (restore time, recoveries)

    # ---- actors -------------------------------------------------------------------------------
    def start_actors(self) -> None:
        import ray

        from actors.checkpointer import Checkpointer
        from placement.launch import launch
        from placement.plan import make_plan

        cfg = self.cfg
        self.plan = make_plan(cfg, use_gpu=self.device == "cuda")
        self.actors = launch(cfg, self.plan, cfg.trainer.policy.model.path, self.total_steps)
        self.actors.checkpointer = ray.remote(Checkpointer).options(
            name="Checkpointer", namespace=cfg.ray.namespace, num_cpus=0).remote(
            cfg.trainer.ckpt_path, cfg.s3, cfg.trainer.max_ckpts_to_keep)
        self.engines = EngineClient(self.actors.engines)
        self.runner = RolloutRunner.from_config(cfg, self.engines.generate, self.prompter, Sync(self.actors.env_pool))

    # ---- the phases of a step -----------------------------------------------------------------
    def rollouts(self, rows: list[dict], step: int):
        from envs.dataset import init_state
        g = self.cfg.generator
        tasks = [Task(f"s{step}-p{i}-n{k}", i, init_state(row), row["seed"])
                 for i, row in enumerate(rows) for k in range(g.n_samples_per_prompt)]
        sampling = Sampling(max_new_tokens=g.sampling_params.max_generate_length,
                            temperature=g.sampling_params.temperature, top_p=g.sampling_params.top_p,
                            seed=self.cfg.trainer.seed * 100_003 + step)
        with self.phases("generate"):
            self.engines.wake_up()
            episodes = self.runner.run(tasks, sampling, self.version)
        self._episodes_generate_s = self.phases.seconds["generate"]
        return episodes

    def advantages(self, episodes) -> np.ndarray:
        a = self.cfg.trainer.algorithm
        return compute_advantages(a.advantage_estimator, [ep.reward for ep in episodes], [ep.group for ep in episodes],
                                  norm_by_std=a.grpo_norm_by_std)

    def update(self, episodes, advantages) -> dict:
        t, a = self.cfg.trainer, self.cfg.trainer.algorithm
        temperature = self.cfg.generator.sampling_params.temperature
        metrics = rollout_metrics(episodes, advantages, self.phases.seconds.get("generate", 0.0))
        items = build_items(episodes, advantages, t.policy_mini_batch_size, a.loss_reduction,
                            drop_zero_advantage=a.filter_zero_advantage_groups)
        metrics["train/sequences"] = len(items)
        if not items:
            return metrics
        if t.placement.colocate_all and self.cfg.generator.inference_engine.enable_sleep:
            self.engines.sleep()  # free the engines' memory while the shards work
        policy, ref = self.actors.policy, self.actors.ref
        shards = split_for_ranks(items, len(policy))
        if ref:
            with self.phases("ref"):
                ref_lp = call_all(ref, "logprobs", [(s, temperature, t.micro_forward_batch_size_per_gpu)
                                                    for s in split_for_ranks(items, len(ref))])
            _assign(split_for_ranks(items, len(ref)), ref_lp, "ref_logprobs")
        if not a.use_rollout_logprobs:
            with self.phases("old_logprobs"):
                old = call_all(policy, "logprobs", [(s, temperature, t.micro_forward_batch_size_per_gpu) for s in shards])
            rollout_lp = np.concatenate([it.old_logprobs for s in shards for it in s])
            _assign(shards, old, "old_logprobs")
            metrics["policy/rollout_logprob_diff"] = float(np.abs(
                rollout_lp - np.concatenate([it.old_logprobs for s in shards for it in s])).mean())
        with self.phases("train"):
            algo = {k: getattr(a, k) for k in ("use_kl_loss", "kl_loss_coef", "kl_estimator_type", "eps_clip_low",
                                               "eps_clip_high", "entropy_coef")}
            results = call_all(policy, "train", [(s, algo, temperature, t.micro_train_batch_size_per_gpu,
                                                  t.update_epochs_per_batch) for s in shards])
        metrics |= {f"policy/{k}": v for k, v in results[0].items()}
        return metrics

    def sync_weights(self) -> dict:
        """Write adapter v{n+1} atomically to shared storage, then hand every engine its path."""
        with self.phases("sync"):
            version = self.version + 1
            folder = self.run_dir / "adapters" / f"v{version}"
            call_all(self.actors.policy, "save_adapter", [(str(folder),)] * len(self.actors.policy))
            self.engines.wake_up()
            loaded = self.engines.load_adapter({"path": str(folder), "version": version})
            if any(v != version for v in loaded):
                raise RuntimeError(f"engines report adapter versions {loaded} after sync to v{version}")
            self.version, self.adapter_dir = version, str(folder)
            self._prune_adapters(keep=2)
        load_s = max(st["last_adapter_load_s"] for st in self.engines.status())
        return {"sync/adapter_version": version, "sync/adapter_load_s": load_s}

    def _prune_adapters(self, keep: int) -> None:
        versions = sorted(int(p.name[1:]) for p in (self.run_dir / "adapters").glob("v*") if p.name[1:].isdigit())
        for v in versions[:-keep]:
            shutil.rmtree(self.run_dir / "adapters" / f"v{v}", ignore_errors=True)

    def evaluate(self, step: int) -> dict:
        """Greedy eval of the current adapter; per-maze results to eval/step_N.jsonl."""
        with self.phases("eval"):
            self.engines.wake_up()
            report = evaluate(self.runner, self.eval_rows, eval_sampling(self.cfg).max_new_tokens, self.version)
        path = self.run_dir / "eval" / f"step_{step:05d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(m) + "\n" for m in report.per_maze))
        self.last_eval = report
        return eval_metrics(report)

    def export(self, step: int) -> dict:
        """{export_path}/global_step_N/policy/: the PEFT adapter the serve app reads."""
        from storage import open_store
        if self.adapter_dir is None:
            return {}
        with self.phases("export"):
            open_store(self.cfg.trainer.export_path, self.cfg.s3).upload_dir(self.adapter_dir,
                                                                             f"global_step_{step}/policy")
        return {}

    def checkpoint(self, step: int) -> dict:
        """Full training state to trainer.ckpt_path; a failed save is reported, and stops the run
        only with trainer.fail_on_ckpt_error."""
        from actors.checkpointer import CheckpointError
        from actors.handles import call
        with self.phases("ckpt"):
            policy_state = call_all(self.actors.policy, "state_dict")[0]
            trainer_state = {"global_step": step, "adapter_version": self.version, "total_steps": self.total_steps,
                             "sampler": self.sampler.state_dict(), "policy_world_size": len(self.actors.policy),
                             "config": to_yaml(self.cfg)}
            try:
                info = call(self.actors.checkpointer, "save", step, trainer_state, policy_state, self.adapter_dir)
            except CheckpointError as e:
                if self.cfg.trainer.fail_on_ckpt_error:
                    raise
                print(f"WARNING: checkpoint at step {step} failed, training goes on: {e}", flush=True)
                return {"ckpt/failed": 1.0}
        return {"ckpt/failed": 0.0, "ckpt/save_s": info["seconds"], "ckpt/bytes": info["bytes"]}

    def resume(self, force_latest: bool = False) -> None:
        """Continue from the newest complete checkpoint (resume_mode=latest) or a given one."""
        from actors.checkpointer import Checkpointer, parse_step_path
        from actors.handles import call
        t = self.cfg.trainer
        mode = "latest" if force_latest else t.resume_mode
        if mode == "none":
            return
        if mode == "from_path":
            root, step = parse_step_path(t.resume_path)
            source = Checkpointer(root, self.cfg.s3)
        else:
            source, step = self.actors.checkpointer, call(self.actors.checkpointer, "latest")
            if step is None:
                return
        with self.phases("restore"):
            trainer_state = call(source, "load_trainer_state", step)
            version = int(trainer_state["adapter_version"])
            folder = self.run_dir / "adapters" / f"v{version}"
            policy_state = call(source, "load_policy_state", step, str(folder))
            call_all(self.actors.policy, "load_state_dict", [(policy_state,)] * len(self.actors.policy))
            if version:
                self.engines.load_adapter({"path": str(folder), "version": version})
            self.sampler.load_state_dict(trainer_state["sampler"])
            self.step, self.version, self.adapter_dir = int(trainer_state["global_step"]), version, str(folder)
        self.pending_metrics["ckpt/restore_s"] = self.phases.seconds["restore"]
        print(f"resumed from {t.ckpt_path if mode == 'latest' else t.resume_path} at step {self.step} "
              f"(adapter v{version}) in {self.phases.seconds['restore']:.1f}s", flush=True)

    def recover(self, failure: Exception, step: int) -> None:
        """An actor died: tear every actor group down, rebuild it, reload the latest checkpoint."""
        from placement.launch import teardown
        self.restarts += 1
        cause = str(failure).strip().splitlines()[0][:300] if str(failure).strip() else type(failure).__name__
        if self.restarts > self.cfg.trainer.max_restarts:
            raise RuntimeError(f"giving up after {self.restarts - 1} restarts (trainer.max_restarts="
                               f"{self.cfg.trainer.max_restarts}); last failure at step {step}: {cause}") from failure
        print(f"RECOVERY {self.restarts}/{self.cfg.trainer.max_restarts}: step {step} failed: {cause}", flush=True)
        started, completed = time.perf_counter(), self.step
        teardown(self.actors)
        self.start_actors()
        self.step, self.version, self.adapter_dir = 0, 0, None
        self.sampler.epoch = self.sampler.cursor = 0
        self.resume(force_latest=True)
        if self.log_file is not None:
            self.log_file.rewind(self.step)
        record = {"restart": self.restarts, "failed_step": step, "resumed_from": self.step,
                  "steps_lost": completed - self.step, "cause": cause, "rebuild_s": time.perf_counter() - started}
        self.recoveries.append(record)
        with open(self.run_dir / "recoveries.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        self.pending_metrics |= {"recovery/restarts": self.restarts, "recovery/steps_lost": record["steps_lost"]}
        print(f"RECOVERY {self.restarts}: resumed at step {self.step}; {record['steps_lost']} step(s) done since "
              f"that checkpoint are lost and redone ({record['rebuild_s']:.1f}s)", flush=True)

    def chaos_kill(self, method: str = "sigkill") -> str:
        """--chaos-kill-every: kill a random actor, by SIGKILL of its process (as a crash would), with
        ray.kill, or alternating between the two ("mixed")."""
        import os
        import signal

        import ray
        name, handle = random.Random(self.step).choice(sorted(self.actors.all_handles().items()))
        if method == "mixed":
            method = ("sigkill", "ray_kill")[self.chaos_kills % 2]
        self.chaos_kills += 1
        self.chaos_steps.add(self.step)
        with open(self.run_dir / "chaos.jsonl", "a") as f:
            f.write(json.dumps({"time": time.time(), "after_step": self.step, "actor": name, "method": method}) + "\n")
        if method == "ray_kill":
            print(f"CHAOS: ray.kill({name}) after step {self.step}", flush=True)
            ray.kill(handle)
        else:
            pid = ray.get(handle.__ray_call__.remote(lambda actor: os.getpid()))
            print(f"CHAOS: SIGKILL {name} (pid {pid}) after step {self.step}", flush=True)
            os.kill(pid, signal.SIGKILL)
        return name

    # ---- logging ------------------------------------------------------------------------------
    def log(self, step: int, metrics: dict) -> None:
        if self.log_file is None:
            self.log_file = RunLog(str(self.run_dir), resume_from_step=self.step)
        self.log_file.log(step, {**metrics, **self.pending_metrics, "time": time.time()})
        self.pending_metrics = {}

    def step_line(self, step: int, m: dict) -> str:
        solve = f" | eval solve {100 * m['eval/all/avg_score']:.1f}%" if "eval/all/avg_score" in m else ""
        return (f"step {step}/{self.total_steps} | reward {m.get('reward/avg_raw_reward', 0):.3f}{solve} | "
                f"{m['timing/step']:.1f}s (gen {m.get('timing/generate', 0):.1f}s, train {m.get('timing/train', 0):.1f}s)")

    def finish(self) -> dict:
        from telemetry.curve import plot_learning_curve, summary_line
        history = self.log_file.history() if self.log_file else []
        ceiling = getattr(getattr(self, "last_eval", None), "oracle_ceiling", None)
        plot_learning_curve(history, str(self.run_dir / "learning_curve.png"), ceiling)
        line = summary_line(history)
        print(line)
        print(f"run folder: {self.run_dir} (metrics.jsonl, tensorboard/, learning_curve.png, eval/)")
        if self.log_file:
            self.log_file.close()
        return {"summary": line, "history": history}


def _assign(shards, values, attr: str) -> None:
    for shard, vals in zip(shards, values):
        for item, v in zip(shard, vals):
            setattr(item, attr, v)


def evaluate_locally(cfg, eval_set: str | None, adapter: str | None) -> EvalReport:
    """--eval-only: the engine and env pool in this process, no Ray needed."""
    import tempfile

    from actors.vllm_engine import VLLMEngine
    from storage import is_s3, open_store
    from vlm.load import resolve_model_path
    from vlm.processor import load_processor

    _, eval_rows = load_datasets(cfg, eval_set)
    device = resolve_device(cfg)
    engine = VLLMEngine(cfg.trainer.policy.model.path, backend=cfg.generator.inference_engine.backend, device=device,
                        s3_cfg=cfg.s3)
    version = 0
    if adapter:
        folder = adapter
        if is_s3(adapter):
            folder = open_store(adapter, cfg.s3).download_dir("", tempfile.mkdtemp(prefix="visrl-adapter-"))
        version = engine.load_adapter({"path": folder, "version": 1})
    processor = load_processor(resolve_model_path(cfg.trainer.policy.model.path, cfg.s3))
    runner = RolloutRunner.from_config(cfg, EngineClient([engine]).generate, make_prompter(processor, cfg))
    report = evaluate(runner, eval_rows, eval_sampling(cfg).max_new_tokens, version)
    out = Path(cfg.trainer.run_dir) / "eval_only.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(m) + "\n" for m in report.per_maze))
    print(f"per-maze results: {out}")
    return report
