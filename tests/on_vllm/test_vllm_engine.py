"""The rollout engine on the real vLLM (its CPU build) against the hf engine, on the embedded base.

No mocks: both engines run in this process over the same eval mazes through `RolloutRunner`.
Both compute in fp32 here, so greedy answers must be identical and log-probs agree to 1e-4
(measured: at most 1e-5).
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from actors.env_pool import EnvPool
from actors.handles import EngineClient
from actors.vllm_engine import StaleAdapterError, VLLMEngine, engine_settings
from inference.requests import Sampling
from inference.vllm_backend import AdapterRankError
from rl.inputs import load_datasets, make_prompters
from rl.rollout import RolloutRunner, task_of
from settings import load_config
from storage.adapters import AdapterRef
from tests.helpers import EMBEDDED_BASE as BASE
from tests.helpers import make_adapter
from vlm.processor import load_processor

ROOT = Path(__file__).resolve().parents[2]
GREEDY = Sampling(max_new_tokens=8, temperature=0.0)
LOGPROB_TOL = 1e-4


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    return load_config(None, [f"data.dataset_dir={data}", "data.eval_size=16", "data.train_size=16"])


@pytest.fixture(scope="module")
def eval_rows(cfg):
    return load_datasets(cfg)[1]


def engine_and_runner(cfg, backend):
    cfg = load_config(None, [f"data.dataset_dir={cfg.data.dataset_dir}", f"generator.inference_engine.backend={backend}"])
    engine = VLLMEngine(BASE, device="cpu", **engine_settings(cfg))
    env = EnvPool(cfg.environment.env_class, cfg.environment.cell_px, cfg.generator.max_turns)
    runner = RolloutRunner.from_config(cfg, EngineClient([engine]).generate, make_prompters(load_processor(BASE), cfg), env)
    return engine, runner


@pytest.fixture(scope="module")
def engines(cfg):
    built = {backend: engine_and_runner(cfg, backend) for backend in ("hf", "vllm")}
    yield built
    # without shutdown the engine core and its worker (5 GB) outlived pytest, orphaned
    started = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("VLLM::")]
    assert started, "the vllm engine runs its engine core in a child process"
    built["vllm"][0].shutdown()
    _, left = psutil.wait_procs(started, timeout=60)
    assert not left, f"vLLM processes left after shutdown: {[p.name() for p in left]}"


@pytest.fixture(scope="module")
def trained_adapter(tmp_path_factory):
    """Two GRPO steps of the default run with backend=vllm, through the driver's Ray actors."""
    run = tmp_path_factory.mktemp("vllm-run")
    args = ["generator.inference_engine.backend=vllm", f"trainer.run_dir={run}", f"data.dataset_dir={run}/data",
            "data.train_size=16", "trainer.train_batch_size=8", "data.eval_size=16", "data.validation_size=8",
            "trainer.epochs=1", "trainer.eval_interval=1",
            f"trainer.export_path={run}/exports", f"trainer.ckpt_path={run}/ckpts", "trainer.hf_save_interval=2"]
    out = subprocess.run([sys.executable, "driver.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert out.returncode == 0, out.stderr[-3000:]
    return run


def episodes(runner, rows, sampling, version):
    tasks = [task_of(r, f"e{i}", i) for i, r in enumerate(rows)]
    return runner.run(tasks, sampling, version)


def assert_same_episodes(hf_eps, vllm_eps):
    assert len(hf_eps) == len(vllm_eps) >= 16
    for a, b in zip(hf_eps, vllm_eps):
        assert [t.response_ids for t in a.turns] == [t.response_ids for t in b.turns], a.episode_id
        assert a.reward == b.reward
        for ta, tb in zip(a.turns, b.turns):
            assert max(abs(x - y) for x, y in zip(ta.logprobs, tb.logprobs)) < LOGPROB_TOL


def test_greedy_episodes_equal_hf_on_the_base(engines, eval_rows):
    hf = episodes(engines["hf"][1], eval_rows, GREEDY, 0)
    vl = episodes(engines["vllm"][1], eval_rows, GREEDY, 0)
    assert sum(len(e.turns) for e in hf) > 2 * len(hf)  # multi-turn: pictures of later turns were used
    assert_same_episodes(hf, vl)


def test_seeded_samples_differ_in_a_group_and_repeat_on_a_rerun(engines, eval_rows):
    runner = engines["vllm"][1]
    group = [eval_rows[0]] * 16  # one maze, sixteen samples: a GRPO group
    sampling = Sampling(max_new_tokens=8, temperature=1.0, seed=11)
    first = [[t.response_ids for t in e.turns] for e in episodes(runner, group, sampling, 0)]
    again = [[t.response_ids for t in e.turns] for e in episodes(runner, group, sampling, 0)]
    assert first == again
    assert len({json.dumps(e) for e in first}) >= 8  # one seed for the batch gave 1 distinct answer


def test_trained_adapter_episodes_equal_hf(engines, eval_rows, trained_adapter):
    history = [json.loads(line) for line in (trained_adapter / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [0, 1, 2]
    assert history[-1]["sync/adapter_version"] == 2 and "timing/generate" in history[-1]
    folder = trained_adapter / "exports" / "global_step_2" / "policy"
    for engine, _ in engines.values():
        engine.load_adapter(AdapterRef(str(folder), 1))
    assert_same_episodes(episodes(engines["hf"][1], eval_rows, GREEDY, 1), episodes(engines["vllm"][1], eval_rows, GREEDY, 1))


def test_version_two_replaces_version_one(cfg, engines, eval_rows, trained_adapter, tmp_path):
    """v2 is written over v1's folder: only a fresh LoRA id a version keeps vLLM from its cached v1."""
    engine, runner = engines["vllm"]
    hf_engine, hf_runner = engine_and_runner(cfg, "hf")  # a fresh one: PEFT keeps the first adapter's layout
    folder = tmp_path / "adapter"
    make_adapter(BASE, folder, seed=1, rank=8, scale=3.0)  # all-linear: the vision tower's layers too
    engine.load_adapter(AdapterRef(str(folder), 10))
    v1 = episodes(runner, eval_rows, GREEDY, 10)
    # v2 a trained adapter: with a second random one at scale 3, hf and vLLM parted in 5 of 16 episodes
    # on the base of 2026-12-05, each where hf's own token had under 60% of the probability
    shutil.copytree(trained_adapter / "exports" / "global_step_2" / "policy", folder, dirs_exist_ok=True)
    for e in (engine, hf_engine):
        e.load_adapter(AdapterRef(str(folder), 11))
    v2 = episodes(runner, eval_rows, GREEDY, 11)
    assert [t.response_ids for e in v1 for t in e.turns] != [t.response_ids for e in v2 for t in e.turns]
    assert_same_episodes(episodes(hf_runner, eval_rows, GREEDY, 11), v2)
    # loaded at the sync, not at the next generate, and the older version left the engine
    assert set(engine.backend.llm.llm_engine.list_loras()) == {12}
    assert engine.status()["memory_awake_gib"] is None  # no GPU: no engine memory to report
    with pytest.raises(StaleAdapterError):
        engine.generate([], GREEDY, expect_version=10)


def test_an_adapter_above_the_rank_limit_is_refused(engines, eval_rows, tmp_path):
    engine, runner = engines["vllm"]
    before = engine.adapter_version
    limit = engine.backend.max_lora_rank
    make_adapter(BASE, tmp_path / "big", seed=3, rank=2 * limit)
    with pytest.raises(AdapterRankError, match=f"rank {2 * limit}.*max_lora_rank {limit}"):
        engine.load_adapter(AdapterRef(str(tmp_path / "big"), before + 1))
    assert engine.adapter_version == before  # the engine still serves what it held
    assert len(episodes(runner, eval_rows[:2], GREEDY, before)) == 2
