"""The hf engine and the multi-turn rollout: batching, adapters and versions, the loss mask."""
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from actors.env_pool import EnvPool
from actors.handles import EngineClient
from actors.vllm_engine import StaleAdapterError, VLLMEngine
from envs.prompt import INSTRUCTION
from inference.requests import GenRequest, Sampling
from rl.rollout import RolloutRunner, Task
from storage.adapters import AdapterRef
from tests.helpers import requests_for
from vlm.forward import score_seqs
from vlm.processor import load_processor

GREEDY = Sampling(max_new_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return VLLMEngine(tiny_model_dir, backend="hf", device="cpu")


def test_batched_equals_unbatched_under_greedy(engine, prompter):
    # mixed prompt lengths and picture counts in one batch
    reqs = requests_for(prompter, [1, 2, 3, 4], ["", "Moved up.", "Cannot move into a wall.", ""])
    batched = engine.generate(reqs, GREEDY)
    single = [engine.generate([r], GREEDY)[0] for r in reqs]
    assert [b.token_ids for b in batched] == [s.token_ids for s in single]
    for b, s in zip(batched, single):
        np.testing.assert_allclose(b.logprobs, s.logprobs, atol=1e-4)
        assert len(b.logprobs) == len(b.token_ids) and all(lp <= 0 for lp in b.logprobs)


def test_adapter_changes_outputs_and_version_is_recorded(tiny_model_dir, adapter_dir, prompter):
    engine = VLLMEngine(tiny_model_dir, backend="hf", device="cpu")
    reqs = requests_for(prompter, [5, 6, 7], ["", "", ""])
    base = engine.generate(reqs, GREEDY)
    assert all(r.adapter_version == 0 for r in base)
    assert engine.load_adapter(AdapterRef(adapter_dir, 3)) == 3
    tuned = engine.generate(reqs, GREEDY, expect_version=3)
    assert all(r.adapter_version == 3 for r in tuned)
    assert [r.logprobs for r in tuned] != [r.logprobs for r in base]
    with pytest.raises(StaleAdapterError, match="v3"):
        engine.generate(reqs, GREEDY, expect_version=2)
    with pytest.raises(StaleAdapterError):
        engine.load_adapter(AdapterRef(adapter_dir, 1))
    engine.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(reqs, GREEDY)
    engine.wake_up()
    assert engine.generate(reqs[:1], GREEDY, expect_version=3)[0].token_ids == tuned[0].token_ids



def test_a_bf16_engine_holds_its_adapter_in_bf16(tiny_model_dir, adapter_dir):
    """PEFT would keep the adapter in fp32: on a GPU every LoRA layer of every decode step then cast
    to fp32 and back around fp32 matmuls (a third of the rollout's GPU time at 8B)."""
    engine = VLLMEngine(tiny_model_dir, backend="hf", device="cpu", dtype="bfloat16")
    engine.load_adapter(AdapterRef(adapter_dir, 1))
    stored = load_file(f"{adapter_dir}/adapter_model.safetensors")
    loaded = {n.replace(".default", ""): p for n, p in engine.backend.model.named_parameters() if "lora_" in n}
    assert loaded and {p.dtype for p in loaded.values()} == {torch.bfloat16}
    assert sorted(loaded) == sorted(stored)
    assert all(torch.equal(loaded[n], t.to(torch.bfloat16)) for n, t in stored.items())

def test_cut_picture_is_refused(engine, prompter):
    req = requests_for(prompter, [1], [""])[0]
    first_pad = req.prompt_ids.index(prompter.image_token_id)
    cut = GenRequest(prompt_ids=req.prompt_ids[:first_pad + 40], images=req.images)  # mid-picture
    assert cut.prompt_ids.count(prompter.image_token_id) == 40  # 41 of the picture's 81 tokens are gone
    with pytest.raises(ValueError, match="image tokens"):
        engine.generate([cut], GREEDY)
    assert len(engine.generate([req], GREEDY)) == 1  # the whole picture is fine


@pytest.mark.parametrize("window, pictures", [(0, 0), (1, 0), (2, 0), (3, 1)])
def test_loss_mask_covers_exactly_the_models_turns(engine, prompter, tiny_model_dir, window, pictures):
    tok = prompter.tok
    runner = RolloutRunner(EngineClient([engine]).generate, EnvPool("maze_2d/easy", 16, 6), {"maze_2d/easy": prompter}, 6, 8192,
                           window, pictures)
    episodes = runner.run([Task(f"e{i}", i, seed=i, env_id="maze_2d/easy") for i in range(4)],
                          Sampling(max_new_tokens=5, temperature=1.0, seed=7), 0)
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    for ep in episodes:
        assert ep.stop_reason in ("stop", "truncated") and 1 <= len(ep.turns) <= 6
        seqs = ep.sequences()
        n = len(ep.turns)
        # window 0 keeps one growing sequence; window 2 merges turns 0 and 1 (turn 1's prompt still
        # starts with turn 0), then each turn starts afresh; window 1, or a dropped picture, never merges
        assert len(seqs) == {(0, 0): 1, (1, 0): n, (2, 0): max(1, n - 1), (3, 1): n}[(window, pictures)]
        masked_in = [t for s in seqs for t, m in zip(s.input_ids, s.loss_mask) if m]
        assert masked_in == [t for turn in ep.turns for t in turn.response_ids]
        assert tok.decode(masked_in) == "".join(tok.decode(t.response_ids) for t in ep.turns)
        for s in seqs:
            assert len(s.input_ids) == len(s.loss_mask) == len(s.logprobs)
            assert s.input_ids.count(image_id) == 81 * len(s.images)  # every picture in full
            assert len(s.images) <= (pictures or 99)
            outside = tok.decode([t for t, m in zip(s.input_ids, s.loss_mask) if not m])
            assert INSTRUCTION in outside
            lp = [x for x, m in zip(s.logprobs, s.loss_mask) if m]
            assert all(x <= 0 for x in lp) and len(lp) == sum(s.loss_mask)
        for turn in ep.turns[:-1]:
            assert turn.feedback and turn.feedback not in tok.decode(turn.response_ids)
    # the trainer's scoring of the same sequences (several answers a row, rows of several lengths in
    # one pass) gives the log-probs the engine sampled with: the old policy and the gap rest on it
    seqs = [s for ep in episodes for s in ep.sequences()]
    scored = score_seqs(engine.backend.model, load_processor(tiny_model_dir), seqs, 3, "cpu", torch.float32, 1.0)
    for s, logp in zip(seqs, scored):
        np.testing.assert_allclose(logp, s.rollout_logprobs(), atol=1e-4)


def test_length_limit_ends_the_episode_without_cutting_a_picture(engine, prompter):
    runner = RolloutRunner(EngineClient([engine]).generate, EnvPool("maze_2d/easy", 16, 10), {"maze_2d/easy": prompter},
                           10, 260, 0)
    [ep] = runner.run([Task("long", 0, seed=3, env_id="maze_2d/easy")], Sampling(max_new_tokens=5, temperature=1.0, seed=1), 0)
    assert ep.stop_reason == "length" and ep.reward == 0
    assert all(len(t.prompt_ids) + 5 <= 260 for t in ep.turns)
