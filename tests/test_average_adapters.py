"""bench/average_adapters.py: the mean of one run's adapters, and a clear refusal of mismatched ones."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bench.average_adapters import average_adapters, last_exports


def adapter(folder, a, b, rank=2):
    folder.mkdir(parents=True)
    save_file({"layer.lora_A.weight": torch.full((rank, 3), a), "layer.lora_B.weight": torch.full((3, rank), b)},
              folder / "adapter_model.safetensors")
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "tag": str(folder.name)}))
    return folder


def test_the_mean_of_each_tensor_and_the_last_adapters_config(tmp_path):
    first, last = adapter(tmp_path / "s10", 1.0, -2.0), adapter(tmp_path / "s20", 3.0, 4.0)
    out = average_adapters([first, last], tmp_path / "mean")
    mean = load_file(out / "adapter_model.safetensors")
    assert torch.equal(mean["layer.lora_A.weight"], torch.full((2, 3), 2.0))
    assert torch.equal(mean["layer.lora_B.weight"], torch.full((3, 2), 1.0))
    assert json.loads((out / "adapter_config.json").read_text())["tag"] == "s20"


def test_adapters_of_another_rank_are_refused_by_name(tmp_path):
    first, other = adapter(tmp_path / "a", 1.0, 1.0), adapter(tmp_path / "b", 1.0, 1.0, rank=4)
    with pytest.raises(SystemExit, match="b holds other LoRA tensors"):
        average_adapters([first, other], tmp_path / "mean")
    assert not (tmp_path / "mean").exists()


def test_the_last_exports_by_step_number_not_by_name(tmp_path):
    for step in (10, 100, 20, 90):
        (tmp_path / "exports" / f"global_step_{step}" / "policy").mkdir(parents=True)
    assert [p.parent.name for p in last_exports(tmp_path, 2)] == ["global_step_90", "global_step_100"]
    with pytest.raises(SystemExit, match="fewer than --last 5"):
        last_exports(tmp_path, 5)
