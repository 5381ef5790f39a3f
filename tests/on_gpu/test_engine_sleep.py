"""The hf engine's sleep on a GPU: weights go to page-locked host buffers, made once, and come back
unchanged.

Needs CUDA: skipped elsewhere (CI has no GPU); on a GPU machine run `python -m pytest tests/on_gpu`.
"""
import pytest
import torch

from actors.vllm_engine import VLLMEngine
from inference.requests import AdapterRef, Sampling
from tests.test_engine_rollout import requests_for

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GREEDY = Sampling(temperature=0.0, max_new_tokens=8)


def test_sleep_frees_the_weights_and_wake_restores_them(tiny_model_dir, adapter_dir, prompter):
    engine = VLLMEngine(tiny_model_dir, backend="hf", device="cuda", dtype="bfloat16")
    reqs = requests_for(prompter, [5, 6, 7], ["", "", ""])
    base_params = list(engine.backend.model.parameters())
    engine.sleep()
    first_buffers = {id(p): p.data_ptr() for p in base_params}
    engine.wake_up()
    engine.load_adapter(AdapterRef(adapter_dir, 1))  # PEFT wraps the model: the base weights get new names
    model = engine.backend.model
    before = engine.generate(reqs, GREEDY)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    awake = torch.cuda.memory_allocated()
    engine.sleep()
    assert awake - torch.cuda.memory_allocated() >= weight_bytes  # every parameter left the GPU
    assert all(p.device.type == "cpu" and p.is_pinned() for p in model.parameters())
    assert {id(p): p.data_ptr() for p in base_params} == first_buffers  # the first sleep's buffers, reused
    engine.wake_up()
    assert all(p.device.type == "cuda" for p in model.parameters())
    after = engine.generate(reqs, GREEDY, expect_version=1)
    assert [r.token_ids for r in after] == [r.token_ids for r in before]
    assert [r.logprobs for r in after] == [r.logprobs for r in before]
