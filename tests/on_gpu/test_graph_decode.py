"""The hf engine's decode loop replayed as CUDA graphs: the same tokens and log-probs as the loop
run eagerly (which tests/test_graph_decode.py holds to `generate` and to the trainer), across
adapter versions (loaded into the captured weights in place), sleep and wake (the weights move:
the graphs are captured again) and merged adapters; and the trainer's log-probs on this GPU's
transformers.

Needs CUDA: skipped elsewhere; on a GPU machine run `python -m pytest tests/on_gpu`.
"""
import numpy as np
import pytest
import torch

from actors.vllm_engine import VLLMEngine
from inference.requests import Sampling
from storage.adapters import AdapterRef
from tests.helpers import assert_trainer_agrees, requests_for

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
GREEDY = Sampling(temperature=0.0, max_new_tokens=8)


def same_outputs(a, b):
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-4)


@pytest.mark.parametrize("merge_lora", [False, True])
def test_graphs_decode_as_generate(tiny_model_dir, adapter_dir, second_adapter, prompter, merge_lora):  # noqa: F811
    engines = {loop: VLLMEngine(tiny_model_dir, backend="hf", device="cuda", dtype="float32", merge_lora=merge_lora,
                                decode_loop=loop) for loop in ("graphs", "eager")}
    batches = [requests_for(prompter, [1, 2, 3], ["Moved up.", "", "Cannot move into a wall."]),
               requests_for(prompter, [4, 5], ["Moved up.", ""])]
    for version, adapter in ((1, adapter_dir), (2, second_adapter)):
        for engine in engines.values():
            engine.load_adapter(AdapterRef(adapter, version))
        for reqs in batches:
            same_outputs(engines["graphs"].generate(reqs, GREEDY), engines["eager"].generate(reqs, GREEDY))
        for engine in engines.values():
            engine.sleep()
            engine.wake_up()
    decoder = engines["graphs"].backend.decoder
    assert decoder.captures == 2  # one bucket, captured again after the first sleep


def test_bf16_sampling_replays_the_eager_loop(tiny_model_dir, adapter_dir, prompter):
    engines = {loop: VLLMEngine(tiny_model_dir, backend="hf", device="cuda", dtype="bfloat16", decode_loop=loop)
               for loop in ("graphs", "eager")}
    reqs = requests_for(prompter, [6, 7, 8, 9], ["", "Moved left.", "", "Moved down."])
    for engine in engines.values():
        engine.load_adapter(AdapterRef(adapter_dir, 1))
    sampling = Sampling(temperature=0.7, max_new_tokens=8, seed=5)
    same_outputs(engines["graphs"].generate(reqs, sampling), engines["eager"].generate(reqs, sampling))


def test_graph_logprobs_are_the_trainers(tiny_model_dir, adapter_dir, prompter):
    engine = VLLMEngine(tiny_model_dir, backend="hf", device="cuda", dtype="float32")
    engine.load_adapter(AdapterRef(adapter_dir, 1))
    assert_trainer_agrees(engine, prompter, tiny_model_dir, "cuda", 1e-4)
    assert engine.backend.decoder.captures == 1
