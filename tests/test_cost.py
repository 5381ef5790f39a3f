"""bench/cost.py (a finished run's devices, hours and cost, from its own config.yaml and metrics.jsonl) and
bench/step_model.py (the reference run's passes and each sharding design's bytes)."""
import json

import pytest

from bench.cost import cost, devices_of
from settings import load_config
from tests.helpers import ROOT


def test_a_run_costs_its_devices_times_its_wall_clock(tiny_run, tmp_path):
    run, finished = tiny_run
    assert finished.returncode == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    wall_h = (lines[-1]["time"] - lines[0]["time"]) / 3600
    c = cost(run, rate=3.0)
    assert c["steps"] == 2 and c["devices"] == 1
    assert c["wall_h"] == pytest.approx(wall_h) and c["cost"] == pytest.approx(3.0 * wall_h)
    assert 0 < c["steps_h"] <= c["wall_h"]  # the steps' own time leaves out start-up and the first eval
    by_node = cost(run, rate=80.0, per="node", gpus_per_node=8)  # a node's rate buys all its devices
    assert by_node["billed_devices"] == 8 and by_node["cost"] == pytest.approx(80.0 * wall_h)


def test_devices_follow_the_placement():
    """The reference's layout: 6 policy devices with the engines and the reference on them; separated
    pools add the engines' devices."""
    reference = load_config(ROOT / "configs" / "hyperpod_qwen3vl_8b.yaml", ["trainer.ckpt_path=s3://b/c"])
    assert devices_of(reference) == 6
    apart = load_config(ROOT / "configs" / "hyperpod_qwen3vl_8b.yaml",
                        ["trainer.ckpt_path=s3://b/c", "trainer.placement.colocate_all=false",
                         "generator.inference_engine.num_engines=2"])
    assert devices_of(apart) == 6 + 2 + (6 if apart.trainer.ref_source() == "shards" else 0)


def test_a_folder_that_is_not_a_run_is_named(tmp_path):
    with pytest.raises(SystemExit, match="config.yaml not found"):
        cost(tmp_path, rate=1.0)


def test_the_step_model_counts_the_reference_runs_passes_and_each_designs_bytes():
    """bench/step_model.py: the reference config's micro-batches a shard (32 sequences, one a micro-batch;
    the KL reference and the later mini-batch's old policy scored), and the byte formulas' shape: hybrid
    over one node is the full shard, the base whole never gathers, and only the full shard sends the
    gathers across nodes."""
    from bench.step_model import design_bytes, gathered_bytes, passes
    cfg = load_config(ROOT / "configs" / "hyperpod_qwen3vl_8b.yaml", ["trainer.ckpt_path=s3://b/c"])
    p = passes(cfg)
    assert (p["shards"], p["per_node"], p["seqs"], p["train"], p["scored"]) == (6, 2, 32, 32, 32 + 16)
    assert p["reductions"] == 2  # gradients cross once a mini-batch (2 of 12 prompts), not once a micro-batch
    w = gathered_bytes(p["forwards"], p["train"], base=100.0, root=10.0, lora_gathered=1.0)
    assert w == 80 * 101 + 32 * 91
    full = design_bytes(-1, 6, 2, w, 2.0, 2)
    assert full["across"] == pytest.approx((w + 2 * 2.0) * 5 / 6) and full["inside"] == 0
    assert design_bytes(2, 2, 2, w, 2.0, 2)["inside"] == pytest.approx(design_bytes(-1, 2, 2, w, 2.0, 2)["inside"])
    whole = design_bytes(1, 6, 2, w, 2.0, 2)
    assert whole == {"inside": 0.0, "across": pytest.approx(2 * 2 * 2.0 * 5 / 6)}
    hybrid = design_bytes(2, 6, 2, w, 2.0, 2)
    assert hybrid["across"] == pytest.approx(2 * 2 * 1.0 * 2 / 3)
    assert hybrid["across"] < whole["across"] < full["across"]


def test_the_step_model_times_each_schedule_by_its_pools():
    """Colocated, a step is generate + train on every GPU; one-step-off at best the longer of the two;
    separate pools scale each phase by the GPUs it has, in turn or side by side."""
    from bench.step_model import schedules
    rows = {name: (gpus, step) for name, gpus, step in schedules(generate=10.0, train=30.0, gpus=6)}
    assert rows["colocated, synchronous"] == (6, 40.0)
    assert rows["colocated, one-step-off (both awake; a bound)"] == (6, 30.0)
    assert rows["separate 4 + 2, synchronous"] == (6, pytest.approx(10 * 3 + 30 * 1.5))
    assert rows["separate 4 + 2, one-step-off"] == (6, pytest.approx(45.0))  # the shards' 4 GPUs bound it
    assert rows["6 shard GPUs + 2 engine GPUs, one-step-off"] == (8, pytest.approx(30.0))
    assert len([r for r in rows if r.startswith("separate")]) == 6  # 5+1, 4+2, 3+3, each both ways
