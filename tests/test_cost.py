"""bench/cost.py: a finished run's devices, hours and cost, from its own config.yaml and metrics.jsonl."""
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
