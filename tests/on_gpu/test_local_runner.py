"""`driver.py --eval-only` and the benches run their in-process engine in the dtype the driver's
engines use: bf16 on a GPU (an fp32 8B engine is twice the memory and rolled out 2x slower).

Needs CUDA: skipped elsewhere (CI has no GPU); on a GPU machine run `python -m pytest tests/on_gpu`.
"""
import pytest
import torch

from actors.local import local_runner
from settings.load import load_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_the_in_process_engine_is_bf16_on_a_gpu(tiny_model_dir):
    cfg = load_config(None, [f"trainer.policy.model.path={tiny_model_dir}", "trainer.device=cuda"])
    runner, version = local_runner(cfg)
    model = runner.generate.__self__.engines[0].backend.model
    assert version == 0
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert next(model.parameters()).device.type == "cuda"


def test_models_on_a_gpu_attend_without_cudnn_plans(tiny_model_dir):
    from vlm.load import load_model
    torch.backends.cuda.enable_cudnn_sdp(True)
    load_model(tiny_model_dir, device="cpu")
    assert torch.backends.cuda.cudnn_sdp_enabled()  # a CPU model leaves the process's choice alone
    load_model(tiny_model_dir, device="cuda", dtype=torch.bfloat16)
    assert not torch.backends.cuda.cudnn_sdp_enabled()
