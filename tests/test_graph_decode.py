"""The engine's own decode loop (inference/graph_decode.py), run eagerly on the CPU: it must give
what transformers' `generate` gives, and log-probs the trainer's scoring agrees with. On a GPU the
same step is replayed as a CUDA graph (tests/on_gpu/test_graph_decode.py)."""
import numpy as np
import pytest

from actors.vllm_engine import VLLMEngine
from inference.graph_decode import batch_bucket
from inference.requests import Sampling
from storage.adapters import AdapterRef
from tests.helpers import assert_trainer_agrees, requests_for


@pytest.fixture(scope="module")
def engines(tiny_model_dir, adapter_dir):
    """The same weights and adapter behind both loops."""
    pair = {loop: VLLMEngine(tiny_model_dir, backend="hf", device="cpu", decode_loop=loop) for loop in ("hf", "eager")}
    for engine in pair.values():
        engine.load_adapter(AdapterRef(adapter_dir, 1))
    return pair


def test_greedy_decoding_equals_generate(engines, prompter):
    greedy = Sampling(max_new_tokens=7, temperature=0.0)
    # a long batch, then a shorter one in the same buffers: stale keys past its prompts must stay unseen
    for reqs in (requests_for(prompter, [1, 2, 3], ["Moved up.", "", "Cannot move into a wall."]),
                 requests_for(prompter, [4, 5], ["Moved up.", ""])):
        ours = engines["eager"].generate(reqs, greedy)
        theirs = engines["hf"].generate(reqs, greedy)
        assert [r.token_ids for r in ours] == [r.token_ids for r in theirs]
        assert all(len(r.token_ids) == 7 or r.finish_reason == "stop" for r in ours)
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert len(engines["eager"].backend.decoder.buffers) == 1  # both batches used one bucket


def test_sampled_logprobs_are_the_trainers(engines, prompter, tiny_model_dir):
    results = assert_trainer_agrees(engines["eager"], prompter, tiny_model_dir, "cpu", 1e-5)
    again = assert_trainer_agrees(engines["eager"], prompter, tiny_model_dir, "cpu", 1e-5)
    assert [r.token_ids for r in again] == [r.token_ids for r in results]  # a seed repeats a rollout


def test_a_prompt_shared_by_several_sequences_is_prefilled_once(engines, prompter):
    """A group's samples start from one prompt: it is prefilled once, and each sequence still
    samples on its own."""
    a, b = requests_for(prompter, [10, 11], ["", "Moved up."])
    reqs = [a, b, a, a, b]
    backend = engines["eager"].backend
    before = backend.decoder.prefilled_rows if backend.decoder else 0
    greedy = Sampling(max_new_tokens=6, temperature=0.0)
    ours = engines["eager"].generate(reqs, greedy)
    decoder = backend.decoder
    assert decoder.prefilled_rows - before == 2
    assert [r.token_ids for r in ours] == [r.token_ids for r in engines["hf"].generate(reqs, greedy)]
    sampled = engines["eager"].generate([a] * 8, Sampling(max_new_tokens=6, temperature=1.0, seed=0))
    assert decoder.prefilled_rows - before == 3
    assert len({tuple(r.token_ids) for r in sampled}) > 1


def test_batches_share_graphs_by_power_of_two_then_by_64():
    assert [batch_bucket(n) for n in (1, 8, 9, 33, 64, 65, 128, 129, 192, 193)] == \
        [8, 8, 16, 64, 64, 128, 128, 192, 192, 256]


def test_an_unknown_decode_loop_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="decode_loop"):
        VLLMEngine(tiny_model_dir, backend="hf", device="cpu", decode_loop="cudagraph")


def test_a_model_missing_what_the_loop_needs_falls_back_to_generate_with_one_warning(tiny_model_dir):
    """A transformers release that renames an internal the decode step reads: the engine says which,
    once, and decodes with `generate`. The stand-in: the tiny model without its text model's final norm."""
    import warnings

    from inference.graph_decode import missing_internals
    from inference.hf_backend import HFBackend
    from vlm.load import load_model
    model, processor = load_model(tiny_model_dir)
    assert missing_internals(model) == []
    del model.model.language_model.norm
    assert missing_internals(model) == ["language_model.norm"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = HFBackend(model, processor, "cpu", decode_loop="eager")
    said = [w for w in caught if "decode loop" in str(w.message)]
    assert len(said) == 1 and "language_model.norm" in str(said[0].message) and backend.decode_loop == "hf"
