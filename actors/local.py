"""An engine and an env pool in this process, without Ray: greedy evaluation of a model and an
adapter for `driver.py --eval-only`, the SFT stop rule and the benches."""
from __future__ import annotations

import tempfile

from actors.env_pool import EnvPool
from actors.handles import EngineClient
from actors.vllm_engine import VLLMEngine, engine_settings
from rl.evaluate import EvalReport, evaluate, evaluation_sampling
from rl.inputs import make_prompters
from rl.rollout import RolloutRunner
from settings import Config
from storage import is_s3, open_store
from storage.adapters import AdapterRef
from vlm.load import compute_dtype, resolve_device, resolve_model_path
from vlm.processor import load_processor


def local_runner(cfg: Config, adapter: str | None = None) -> tuple[RolloutRunner, int]:
    """(a rollout runner over one in-process engine, the adapter version it holds: 1, or 0 without)."""
    t = cfg.trainer
    device = resolve_device(t.device)
    engine = VLLMEngine(t.policy.model.path, device=device, dtype=compute_dtype(device), **engine_settings(cfg))
    version = 0
    if adapter:
        folder = adapter
        if is_s3(adapter):
            folder = open_store(adapter, cfg.s3).download_dir("", tempfile.mkdtemp(prefix="visrl-adapter-"))
        version = engine.load_adapter(AdapterRef(folder, 1))
    prompters = make_prompters(load_processor(resolve_model_path(t.policy.model.path, cfg.s3)), cfg)
    env = EnvPool(cfg.environment.env_class, cfg.environment.cell_px, cfg.generator.max_turns)
    return RolloutRunner.from_config(cfg, EngineClient([engine]).generate, prompters, env), version


def evaluate_locally(cfg: Config, eval_rows: list[dict], adapter: str | None = None) -> EvalReport:
    runner, version = local_runner(cfg, adapter)
    return evaluate(runner, eval_rows, evaluation_sampling(cfg), version, cfg.trainer.eval_batch_size)
