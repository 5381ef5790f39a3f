"""Fixtures tests/on_gpu share."""
import shutil

import pytest
from safetensors.torch import load_file, save_file


@pytest.fixture(scope="module")
def second_adapter(adapter_dir, tmp_path_factory):
    """The same adapter with its B matrices doubled: another version of it."""
    out = tmp_path_factory.mktemp("adapter-v2")
    shutil.copy(f"{adapter_dir}/adapter_config.json", out)
    tensors = load_file(f"{adapter_dir}/adapter_model.safetensors")
    save_file({k: v * 2 if "lora_B" in k else v for k, v in tensors.items()}, str(out / "adapter_model.safetensors"))
    return str(out)
