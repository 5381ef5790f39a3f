"""The hf engine on a GPU: one page-locked host copy of the base holds the weights while the engine
sleeps, and with merge_lora each adapter version is merged over the base restored from it.

Needs CUDA: skipped elsewhere (CI has no GPU); on a GPU machine run `python -m pytest tests/on_gpu`.
"""

import numpy as np
import pytest
import torch

from actors.vllm_engine import VLLMEngine
from inference.requests import Sampling
from storage.adapters import AdapterRef
from tests.helpers import requests_for

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GREEDY = Sampling(temperature=0.0, max_new_tokens=8)


def weights(engine) -> dict:
    return {n: p.detach().cpu().clone() for n, p in engine.backend.model.named_parameters()}


def test_merged_adapter_generates_as_the_unmerged_one(tiny_model_dir, adapter_dir, prompter):
    reqs = requests_for(prompter, [5, 6, 7], ["", "", ""])
    on_gpu = VLLMEngine(tiny_model_dir, backend="hf", device="cuda", dtype="float32", merge_lora=True)
    on_cpu = VLLMEngine(tiny_model_dir, backend="hf", device="cpu", dtype="float32")  # never merges
    for engine in (on_gpu, on_cpu):
        engine.load_adapter(AdapterRef(adapter_dir, 1))
    merged, unmerged = on_gpu.generate(reqs, GREEDY), on_cpu.generate(reqs, GREEDY)
    assert on_gpu.backend.gpu_weights == "merged"
    assert [r.token_ids for r in merged] == [r.token_ids for r in unmerged]
    for a, b in zip(merged, unmerged):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)


def test_versions_restore_the_base_exactly(tiny_model_dir, adapter_dir, second_adapter, prompter):
    reqs = requests_for(prompter, [5, 6, 7], ["", "", ""])
    engine = VLLMEngine(tiny_model_dir, backend="hf", device="cuda", dtype="bfloat16", merge_lora=True)
    for version in range(1, 4):  # v1, v2, v1 again: each merged over the restored base
        engine.load_adapter(AdapterRef(adapter_dir if version % 2 else second_adapter, version))
        first = engine.generate(reqs, GREEDY, expect_version=version)
        if version == 1:
            v1_tokens, v1_weights = [r.token_ids for r in first], weights(engine)
    assert [r.token_ids for r in first] == v1_tokens
    assert all(torch.equal(v, v1_weights[n]) for n, v in weights(engine).items())  # no drift


@pytest.mark.parametrize("merge_lora", [False, True])
def test_sleep_frees_the_weights_and_wake_restores_them(tiny_model_dir, adapter_dir, second_adapter, prompter,
                                                        merge_lora):
    engine = VLLMEngine(tiny_model_dir, backend="hf", device="cuda", dtype="bfloat16", merge_lora=merge_lora)
    reqs = requests_for(prompter, [5, 6, 7], ["", "", ""])
    engine.sleep()  # before any adapter: the host copy is made from the base
    engine.wake_up()
    engine.load_adapter(AdapterRef(adapter_dir, 1))  # PEFT wraps the model: the base weights get new names
    before = engine.generate(reqs, GREEDY)
    merged = weights(engine)
    model = engine.backend.model
    base_bytes = sum(p.numel() * p.element_size() for p in engine.backend._base)
    awake = torch.cuda.memory_allocated()
    host = {id(p): buf.data_ptr() for p, buf in engine.backend._base.items()}
    engine.sleep()
    assert awake - torch.cuda.memory_allocated() >= base_bytes  # the base's weights left the GPU
    assert {id(p): p.data_ptr() for p in engine.backend._base} == host  # into the one host copy
    engine.wake_up()
    after = engine.generate(reqs, GREEDY, expect_version=1)
    assert [(r.token_ids, r.logprobs) for r in after] == [(r.token_ids, r.logprobs) for r in before]
    assert all(torch.equal(v, merged[n]) for n, v in weights(engine).items())
    engine.sleep()
    engine.load_adapter(AdapterRef(second_adapter, 2))  # a version loaded while asleep is merged on waking
    engine.wake_up()
    fresh = VLLMEngine(tiny_model_dir, backend="hf", device="cuda", dtype="bfloat16", merge_lora=merge_lora)
    fresh.load_adapter(AdapterRef(second_adapter, 2))
    assert [r.token_ids for r in engine.generate(reqs, GREEDY)] == [r.token_ids for r in fresh.generate(reqs, GREEDY)]
    expected = weights(fresh)
    assert all(torch.equal(v, expected[n]) for n, v in weights(engine).items())
    assert all(p.device.type == "cuda" for p in model.parameters())
