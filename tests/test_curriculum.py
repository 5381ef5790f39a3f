"""A curriculum's next stage (`trainer.policy.model.lora.init_from`): the run starts from another
run's adapter, the engines generate with it from the step-0 eval on, and a mismatched adapter is
refused before anything is half loaded."""
import json

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import make_adapter, run_driver, tiny_run_args

pytestmark = pytest.mark.slow  # a system test: see setup.cfg's markers


def answers(path):
    return [json.loads(line)["answers"] for line in path.read_text().splitlines()]


def test_a_run_starts_from_another_runs_adapter(tiny_model_dir, tmp_path):
    stage1 = make_adapter(tiny_model_dir, tmp_path / "stage1", seed=5, rank=16)
    run = tmp_path / "stage2"
    out = run_driver(tiny_run_args(tiny_model_dir, run) + [f"trainer.policy.model.lora.init_from={stage1}",
                                                            "trainer.stop_after_step=1"])
    assert out.returncode == 0, out.stderr[-3000:]
    # the shards took its weights and handed them to the engines as adapter v1 ...
    given, v1 = load_file(f"{stage1}/adapter_model.safetensors"), load_file(str(run / "adapters/v1/adapter_model.safetensors"))
    assert v1.keys() == given.keys() and all(torch.equal(v1[k], given[k]) for k in given)
    v2 = load_file(str(run / "adapters/v2/adapter_model.safetensors"))
    assert any(not torch.equal(v2[k], given[k]) for k in given)  # ... and the first step trained on from there
    # the step-0 eval is the adapter's: the greedy answers --eval-only gives with it, not the base's
    evals = {}
    for name, extra in (("with", ["--adapter", stage1]), ("base", [])):
        folder = tmp_path / name
        args = tiny_run_args(tiny_model_dir, folder) + [f"data.dataset_dir={run}/data", "--eval-only", *extra]
        assert run_driver(args).returncode == 0
        evals[name] = answers(folder / "eval_only.jsonl")
    assert answers(run / "eval" / "step_00000.jsonl") == evals["with"] != evals["base"]
    # a checkpoint to resume from takes precedence over the initial adapter
    resumed = run_driver(tiny_run_args(tiny_model_dir, run) + [f"trainer.policy.model.lora.init_from={stage1}"])
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout and "at step 1" in resumed.stdout


def test_an_adapter_of_other_target_modules_is_refused_whole(tiny_model_dir, tmp_path):
    from peft import get_peft_model
    from transformers import AutoModelForImageTextToText

    from actors.policy_shard import FSDPPolicyShard, lora_config
    from storage.adapters import read_weights as read_adapter
    shard = FSDPPolicyShard(tiny_model_dir, lora={"rank": 4, "alpha": 8, "target_modules": "q_proj,v_proj"})
    shard.model = get_peft_model(AutoModelForImageTextToText.from_pretrained(tiny_model_dir), lora_config(shard.lora_cfg))
    before = {n: p.detach().clone() for n, p in shard.model.named_parameters() if p.requires_grad}
    with pytest.raises(ValueError, match="other target_modules"):
        shard.load_adapter_weights(read_adapter(make_adapter(tiny_model_dir, tmp_path / "all", seed=1)))
    params = dict(shard.model.named_parameters())
    assert all(torch.equal(params[n], t) for n, t in before.items())  # nothing half loaded
    matching = make_adapter(tiny_model_dir, tmp_path / "qv", seed=2, target_modules="q_proj,v_proj")
    shard.load_adapter_weights(read_adapter(matching))
    given = load_file(f"{matching}/adapter_model.safetensors")
    assert len(given) == len(before) and all(torch.equal(params[n], given[n.replace(".default.", ".")]) for n in before)
