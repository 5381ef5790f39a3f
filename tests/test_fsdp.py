"""A 2-shard FSDP2 policy on CPU (gloo) matches one shard, and a plain model, on the same batch."""
import pickle

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from net import free_port
from rl.algorithm import policy_loss
from tests.helpers import make_items, spawn_on_items, train_with


def test_two_shards_match_one(tiny_model_dir, tmp_path):
    batch = make_items(tiny_model_dir)
    one, lora_one = train_with(1, tiny_model_dir, tmp_path, batch)
    two, lora_two = train_with(2, tiny_model_dir, tmp_path, batch)
    # one shard is a plain module (FSDP would split nothing); two shard every block and the root
    assert one["fsdp_units"] == 0 and two["fsdp_units"] > 2
    assert one["optimizer_steps"] == two["optimizer_steps"] == 2  # two mini-batches of one prompt each
    assert one["metrics"]["rollout_k3"] > 0  # the engine-vs-trainer gap is measured with rollout log-probs too
    for key in ("policy_loss", "policy_kl", "grad_norm", "entropy", "rollout_logprob_diff", "rollout_k3"):
        assert abs(one["metrics"][key] - two["metrics"][key]) < 1e-4 * max(1, abs(one["metrics"][key])), key
    assert lora_one.keys() == lora_two.keys() and any("lora_B" in k for k in lora_one)
    for result in (one, two):  # the frozen base with the adapter off is the reference a RefShard gives
        refs = result["references"]
        assert refs["from_policy_base"].keys() == refs["ref_shard"].keys()
        for key, expected in refs["ref_shard"].items():
            np.testing.assert_allclose(refs["from_policy_base"][key], expected, atol=1e-6)
        # ...and not the trained policy: switching the adapter off is what makes it the reference
        assert max(np.abs(refs["policy_after"][k] - refs["ref_shard"][k]).max() for k in refs["ref_shard"]) > 1e-4
    moved = 0
    for k in lora_one:
        torch.testing.assert_close(lora_one[k], lora_two[k], atol=2e-5, rtol=1e-4)
        moved += int("lora_B" in k and lora_one[k].abs().sum() > 0)  # B starts at zero: training moved it
    assert moved > 0


@pytest.mark.parametrize("world_size", [1, 2])
def test_bf16_shard_trains_after_scoring_the_reference(tiny_model_dir, tmp_path, world_size):
    """In bf16 (fp32 LoRA weights computed in bf16: FSDP2's mixed precision on two shards, autocast
    on one) a shard whose first forward scores the reference with the adapter off still trains: PEFT's
    disable_adapter() cleared the adapter's requires_grad there, and FSDP2 then left bf16 gradients
    on fp32 weights. Each picture is preprocessed once for both passes."""
    from tests.fsdp_worker import reference_then_train_bf16
    out = spawn_on_items(reference_then_train_bf16, world_size, tiny_model_dir, tmp_path, make_items(tiny_model_dir))
    result = pickle.loads((out / "result.pkl").read_bytes())
    assert result["metrics"]["grad_norm"] > 0 and result["metrics"]["optimizer_steps"] == 2
    assert result["preprocessed"] == result["distinct_pictures"] > 0


@pytest.mark.parametrize("tis", [False, True])
def test_sharded_update_equals_a_plain_model(tiny_model_dir, tmp_path, tis):
    """Two FSDP2 shards give the LoRA update of one plain (unwrapped) PEFT model trained by hand:
    with the engines' log-probs as the old policy, and with TIS over a recomputed old policy."""
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

    from tests.fsdp_worker import ALGORITHM, TIS
    from vlm.forward import collate, sampled_logprobs
    from vlm.load import load_model
    algorithm = TIS if tis else ALGORITHM
    batch = make_items(tiny_model_dir) | {"algorithm": algorithm}
    items = batch["items"]
    two, lora_two = train_with(2, tiny_model_dir, tmp_path, batch)
    torch.manual_seed(0)
    base, processor = load_model(tiny_model_dir)
    for p in base.parameters():
        p.requires_grad_(False)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0)
    with torch.no_grad():  # the trainer's own old policy, before any update
        before = {it.key: sampled_logprobs(model, collate([it.seq], processor, "cpu"))[0] for it in items}
    first_loss = None
    for m in (0, 1):
        chunk = [it for it in items if it.minibatch == m]
        logp, _ = sampled_logprobs(model, collate([it.seq for it in chunk], processor, "cpu"))
        counts = [it.n_scored for it in chunk]

        def flat(values, counts=counts):
            return torch.tensor(np.concatenate([np.full(c, v) for c, v in zip(counts, values)]), dtype=torch.float32)

        w = flat([it.token_weight for it in chunk])
        adv = torch.tensor(np.concatenate([it.advantage for it in chunk]))
        engine = torch.tensor(np.concatenate([it.seq.rollout_logprobs() for it in chunk]))
        old = torch.cat([before[it.key] for it in chunk]) if tis else engine
        ref = torch.tensor(np.concatenate([batch["ref"][it.key] for it in chunk]))
        loss, stats = policy_loss(algorithm, logp, old, adv, w, ref_logp=ref, rollout_logp=engine)  # as the shards
        first_loss = first_loss if first_loss is not None else stats["policy_loss"]
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    plain = get_peft_model_state_dict(model)
    assert plain.keys() == lora_two.keys()
    for k in plain:
        torch.testing.assert_close(plain[k], lora_two[k], atol=5e-5, rtol=1e-4)
    assert np.isfinite(first_loss)
    if tis:  # the fake engine log-probs (-1) are far from the model's: the weights are capped below 1.5
        assert 0 < two["metrics"]["tis_weight"] < 1.5 and two["metrics"]["tis_weight"] != 1.0


def test_one_minibatch_takes_its_old_policy_from_the_training_forward(tiny_model_dir, tmp_path):
    """With one mini-batch and a recomputed old policy (TIS), the training forward runs before any
    update, so it is the old policy: no separate scoring pass. The update is still the one from a
    scoring pass, and the engine-vs-trainer gap still covers every token."""
    from tests.fsdp_worker import TIS
    batch = make_items(tiny_model_dir, prompts_per_minibatch=2) | {"algorithm": TIS}
    assert {it.minibatch for it in batch["items"]} == {0}
    (tmp_path / "one").mkdir()
    result, _ = train_with(1, tiny_model_dir, tmp_path / "one", batch)
    micro_batches = -(-len(batch["items"]) // 2)  # the worker trains micro-batches of 2
    assert result["layer_calls"] == micro_batches  # one forward each: no recompute pass over the batch
    engine = np.concatenate([it.seq.rollout_logprobs() for it in batch["items"]])
    before = np.concatenate([result["before"][it.key] for it in batch["items"]])
    d = before.astype(np.float64) - engine
    np.testing.assert_allclose(result["metrics"]["rollout_k3"], np.mean(np.exp(d) - d - 1), rtol=1e-4)
    # ratio 1 on the first pass: the clip never fires, the TIS weights are min(pi_old/pi_engine, 1.5)
    assert result["metrics"]["clip_ratio"] == 0.0
    np.testing.assert_allclose(result["metrics"]["tis_weight"], np.mean(np.minimum(np.exp(d), 1.5)), rtol=1e-4)


def test_a_checkpoint_from_one_shard_loads_into_two(tiny_model_dir, tmp_path):
    """LoRA and optimizer states are saved gathered, so a resume may change the world size."""
    from tests.fsdp_worker import load_rank
    one, lora_one = train_with(1, tiny_model_dir, tmp_path, make_items(tiny_model_dir))
    state = {"lora": lora_one, **one["state"]}
    state_path = tmp_path / "state.pkl"
    state_path.write_bytes(pickle.dumps(state))
    out = tmp_path / "two"
    out.mkdir()
    mp.start_processes(load_rank, args=(2, free_port(), tiny_model_dir, str(state_path), str(out)),
                       nprocs=2, start_method="spawn", join=True)
    restored = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert restored.keys() == lora_one.keys()
    for k in lora_one:
        assert torch.equal(restored[k], lora_one[k]), k
    again = pickle.loads((out / "restored.pkl").read_bytes())
    assert again["optimizer_steps"] == one["state"]["optimizer_steps"]
    assert again["scheduler"] == one["state"]["scheduler"]
    for name, st in one["state"]["optimizer"]["state"].items():
        for k, v in st.items():
            assert torch.equal(again["optimizer"]["state"][name][k], v), (name, k)


def test_gradient_checkpointing_recomputes_blocks_and_trains_the_same(tiny_model_dir, tmp_path):
    """trainer.gradient_checkpointing: each decoder layer runs again in the backward pass (its
    activations were not kept), and the update is the one without checkpointing."""
    batch = make_items(tiny_model_dir)
    (tmp_path / "plain").mkdir()
    (tmp_path / "ckpt").mkdir()
    plain, lora_plain = train_with(1, tiny_model_dir, tmp_path / "plain", batch)
    checkpointed, lora_ckpt = train_with(1, tiny_model_dir, tmp_path / "ckpt", batch | {"gradient_checkpointing": True})
    assert checkpointed["layer_calls"] == 2 * plain["layer_calls"] > 0
    for key, value in lora_plain.items():
        torch.testing.assert_close(lora_ckpt[key], value, rtol=1e-5, atol=1e-6)
    assert any((v != 0).any() for k, v in lora_ckpt.items() if "lora_B" in k)  # the update did happen


def test_lr_schedule_runs_over_training_steps(tiny_model_dir, tmp_path):
    """Cosine over total_steps training batches, however many optimizer steps each batch takes."""
    from tests.fsdp_worker import schedule_rank
    out = spawn_on_items(schedule_rank, 1, tiny_model_dir, tmp_path, make_items(tiny_model_dir))
    used = pickle.loads((out / "lrs.pkl").read_bytes())
    assert [steps for _, steps in used] == [4, 4, 4]  # two mini-batches, two epochs
    expected = [1e-2 * 0.5 * (1 + np.cos(np.pi * k / 4)) for k in range(3)]
    np.testing.assert_allclose([lr for lr, _ in used], expected, rtol=1e-6)


@pytest.mark.parametrize("world_size,fsdp_size", [(2, -1), (2, 1), (4, 2)])
def test_every_sharding_design_trains_like_one_shard_and_its_collectives_are_counted(tiny_model_dir, tmp_path,
                                                                                     world_size, fsdp_size):
    """Full shard (-1), the base whole on every rank with only LoRA gradients all-reduced (1), and hybrid
    (shard inside pairs, replicate across them): the same update as one shard; with record_collectives
    the bytes say which design moves the frozen base (telemetry/collectives.py)."""
    batch = make_items(tiny_model_dir)
    one, lora_one = train_with(1, tiny_model_dir, tmp_path, batch)
    batch |= {"fsdp_size": fsdp_size, "record_collectives": True}
    many, lora_many = train_with(world_size, tiny_model_dir, tmp_path, batch)
    for key in ("policy_loss", "policy_kl", "grad_norm", "entropy"):
        assert abs(one["metrics"][key] - many["metrics"][key]) < 1e-4 * max(1, abs(one["metrics"][key])), key
    for k in lora_one:
        torch.testing.assert_close(lora_one[k], lora_many[k], atol=2e-5, rtol=1e-4)
    comm = {k: v for k, v in many["metrics"].items() if k.startswith("comm/")}
    print(fsdp_size, {k: round(v, 4) for k, v in sorted(comm.items())})
    base_bytes = many["base_bytes"]
    if fsdp_size == -1:  # every forward and backward gathers each block: the base crosses the wire
        assert comm["comm/world/all_gather_bytes"] > base_bytes / 2 and comm["comm/world/reduce_scatter_bytes"] > 0
    elif fsdp_size == 1:  # nothing of the base moves: a group of one sends nothing; LoRA gradients are all-reduced
        assert comm.get("comm/shard/all_gather_bytes", 0) == 0
        assert 0 < comm["comm/replicate/all_reduce_bytes"] < base_bytes / 10
    else:  # the base is gathered inside a pair only; across pairs only the reduced LoRA gradients travel
        assert comm["comm/shard/all_gather_bytes"] > base_bytes / 4
        assert "comm/replicate/all_gather_bytes" not in comm
        assert 0 < comm["comm/replicate/all_reduce_bytes"] < base_bytes / 10


@pytest.mark.parametrize("world_size", [1, 2])
def test_compiled_decoder_layers_train_like_eager_ones(tiny_model_dir, tmp_path, world_size):
    """trainer.policy.model.compile_layers: the decoder layers run as compiled graphs (whole, no graph
    break; a graph for each kind of pass: scoring, training, the reference with the adapter off, not one
    a layer or a length, so under dynamo's limit of 8, past which a layer would run eagerly unnoticed)
    and train like the eager ones to rounding, on one shard and on two."""
    batch = make_items(tiny_model_dir)
    (tmp_path / "eager").mkdir()
    (tmp_path / "compiled").mkdir()
    eager, lora_eager = train_with(world_size, tiny_model_dir, tmp_path / "eager", batch)
    compiled, lora_compiled = train_with(world_size, tiny_model_dir, tmp_path / "compiled", batch | {"compile_layers": True})
    assert eager["compiled"]["graphs"] == 0
    assert 3 <= compiled["compiled"]["graphs"] < 8 and compiled["compiled"]["graph_breaks"] == 0, compiled["compiled"]
    assert compiled["layer_calls"] == eager["layer_calls"] > 0
    for key in ("policy_loss", "policy_kl", "grad_norm", "entropy"):
        assert abs(eager["metrics"][key] - compiled["metrics"][key]) < 1e-4 * max(1, abs(eager["metrics"][key])), key
    for key, value in lora_eager.items():
        torch.testing.assert_close(lora_compiled[key], value, rtol=1e-4, atol=1e-5)
    assert any((v != 0).any() for k, v in lora_compiled.items() if "lora_B" in k)  # the update did happen


def test_a_token_budget_cuts_smaller_micro_batches_that_train_the_same(tiny_model_dir, tmp_path):
    """trainer.max_tokens_per_micro_batch: a budget of the longest sequence leaves one sequence a
    micro-batch (twice the passes of micro-batches of 2), and the update is the same to rounding."""
    batch = make_items(tiny_model_dir)
    longest = max(len(it.seq.input_ids) for it in batch["items"])
    (tmp_path / "count").mkdir()
    (tmp_path / "budget").mkdir()
    by_count, lora_count = train_with(1, tiny_model_dir, tmp_path / "count", batch)
    budgeted, lora_budget = train_with(1, tiny_model_dir, tmp_path / "budget", batch | {"max_tokens": longest})
    assert budgeted["layer_calls"] == len(batch["items"]) == 2 * by_count["layer_calls"]
    for key in ("policy_loss", "policy_kl", "grad_norm", "entropy"):
        assert abs(by_count["metrics"][key] - budgeted["metrics"][key]) < 1e-5 * max(1, abs(by_count["metrics"][key])), key
    for key, value in lora_count.items():
        torch.testing.assert_close(lora_budget[key], value, rtol=1e-5, atol=1e-6)
    for key, expected in by_count["references"]["policy_after"].items():
        np.testing.assert_allclose(budgeted["references"]["policy_after"][key], expected, atol=1e-5)


def test_tokens_no_engine_sampled_train_with_the_trainers_own_old_policy(tiny_model_dir, tmp_path):
    """An exploratory action (generator.explore_revisits) has NaN sampling log-probs: the trainer takes
    its own pass's log-probs as the old policy's, so the update is the one engine log-probs equal to
    the trainer's would give (one mini-batch: its pass is the old policy), and the engine-vs-trainer
    gap counts no such token."""
    batch = make_items(tiny_model_dir, prompts_per_minibatch=2)
    for it in batch["items"]:
        it.seq.logprobs = [float("nan") if m else lp for lp, m in zip(it.seq.logprobs, it.seq.loss_mask)]
    (tmp_path / "nan").mkdir()
    explored, explored_adapter = train_with(1, tiny_model_dir, tmp_path / "nan", batch)
    assert explored["metrics"]["rollout_logprob_diff"] == 0.0 and np.isfinite(explored["metrics"]["policy_loss"])
    assert explored["metrics"]["clip_ratio"] == 0.0
    for it in batch["items"]:  # the engines' log-probs now equal the trainer's before the update
        own = iter(explored["before"][it.key])
        it.seq.logprobs = [float(next(own)) if m and k else lp
                           for k, (lp, m) in enumerate(zip(it.seq.logprobs, it.seq.loss_mask))]
    (tmp_path / "own").mkdir()
    sampled, sampled_adapter = train_with(1, tiny_model_dir, tmp_path / "own", batch)
    assert sampled["metrics"]["rollout_logprob_diff"] < 1e-5
    assert explored["metrics"]["grad_norm"] > 0  # an update happened: the adapters below are not both untouched
    for name, weight in sampled_adapter.items():
        torch.testing.assert_close(explored_adapter[name], weight, rtol=1e-4, atol=1e-6)
