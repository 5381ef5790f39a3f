"""Runs in spawned processes for test_fsdp.py: one FSDPPolicyShard rank trains on its share."""
import faulthandler
import functools
import os
import pickle
import sys

from settings.schema import AlgorithmConfig

ALGORITHM = AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.1, use_rollout_logprobs=True)
# the trainer recomputes the old policy and corrects toward the engines' log-probs
TIS = AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.1, use_tis=True, tis_imp_ratio_cap=1.5)

# a rank killed by a signal (a gloo abort) prints where it was; pytest's own handler covers only its process
faulthandler.enable(all_threads=True)


def rank_process(worker):
    """End the rank's process as soon as `worker` returns, skipping interpreter teardown. DTensor's
    sharding caches keep the device mesh, and with it the gloo process group and its worker threads,
    alive after destroy_process_group; a gloo thread that touches a Python object while the
    interpreter is being torn down aborts the process ("terminate called without an active
    exception"): once in 21 runs of test_fsdp.py on a loaded 2-core machine. An exception still fails the
    rank as before: spawn's wrapper catches it before this exit is reached."""
    @functools.wraps(worker)
    def run(*args):
        worker(*args)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return run


def _shard(rank, world_size, port, model_dir, seed, optimizer=None, total_steps=1, gradient_checkpointing=False,
           dtype="float32", fsdp_size=-1, record_collectives=False, compile_layers=False, max_tokens=0):
    import torch
    torch.set_num_threads(1)
    from actors.policy_shard import FSDPPolicyShard
    shard = FSDPPolicyShard(model_dir, rank=rank, world_size=world_size, device="cpu",
                            lora={"rank": 4, "alpha": 8}, optimizer=optimizer or {"lr": 1e-2}, seed=seed,
                            total_steps=total_steps, gradient_checkpointing=gradient_checkpointing, dtype=dtype,
                            fsdp_size=fsdp_size, record_collectives=record_collectives, compile_layers=compile_layers,
                            max_tokens_per_micro_batch=max_tokens)
    shard.setup("127.0.0.1", port)
    return shard


@rank_process
def run_rank(rank, world_size, port, model_dir, items_path, out_dir):
    from rl.batch import split_for_ranks

    with open(items_path, "rb") as f:
        batch = pickle.load(f)  # written by the test itself
    shard = _shard(rank, world_size, port, model_dir, seed=0,
                   gradient_checkpointing=batch.get("gradient_checkpointing", False),
                   fsdp_size=batch.get("fsdp_size", -1), record_collectives=batch.get("record_collectives", False),
                   compile_layers=batch.get("compile_layers", False), max_tokens=batch.get("max_tokens", 0))
    mine = split_for_ranks(batch["items"], world_size)[rank]
    before = shard.logprobs(mine, 1.0, micro_batch=2)
    # forward calls of one decoder layer's first norm during train: checkpointing runs each block again in
    # backward (transformers checkpoints the layer's forward, so the layer's own hooks fire once)
    layer = next(m for m in shard.model.modules() if type(m).__name__.endswith("DecoderLayer"))
    calls = []
    hook = layer.input_layernorm.register_forward_hook(lambda *_: calls.append(1))
    metrics = shard.train(mine, batch.get("algorithm", ALGORITHM), 1.0, 2, 1, batch["ref"])
    hook.remove()
    # the reference two ways, now that the adapter has moved: the policy's base with the adapter
    # off, and a RefShard holding its own copy of the base (in this process's group)
    from actors.ref_shard import RefShard
    from_base = shard.reference_logprobs(mine, 1.0, 2)
    ref_shard = RefShard(model_dir, rank=rank, world_size=world_size)
    ref_shard.setup("127.0.0.1", port)
    references = {"from_policy_base": from_base, "ref_shard": ref_shard.logprobs(mine, 1.0, 2),
                  "policy_after": shard.logprobs(mine, 1.0, 2)}
    shard.save_adapter(os.path.join(out_dir, "adapter"))
    state = shard.state_dict()
    from torch.distributed.fsdp import FSDPModule
    fsdp_units = sum(isinstance(m, FSDPModule) for m in shard.model.modules())
    from torch._dynamo.utils import counters
    compiled = {"graphs": counters["stats"]["unique_graphs"], "graph_breaks": sum(counters["graph_break"].values())}
    if rank == 0:
        with open(os.path.join(out_dir, "result.pkl"), "wb") as f:
            pickle.dump({"metrics": metrics, "before": before, "optimizer_steps": state["optimizer_steps"],
                         "state": state, "layer_calls": len(calls), "references": references,
                         "fsdp_units": fsdp_units, "compiled": compiled,
                         "base_bytes": sum(p.numel() * p.element_size() for p in shard.model.parameters()
                                           if not p.requires_grad) * world_size}, f)
    shard.shutdown()


@rank_process
def load_rank(rank, world_size, port, model_dir, state_path, out_dir):
    """Restore a checkpointed state into this many shards, then write the adapter and state back."""
    with open(state_path, "rb") as f:
        state = pickle.load(f)  # written by the test itself
    shard = _shard(rank, world_size, port, model_dir, seed=123)
    shard.load_state_dict(state)
    shard.save_adapter(os.path.join(out_dir, "adapter"))
    again = shard.state_dict()
    if rank == 0:
        with open(os.path.join(out_dir, "restored.pkl"), "wb") as f:
            pickle.dump(again, f)
    shard.shutdown()


@rank_process
def schedule_rank(rank, world_size, port, model_dir, items_path, out_dir):
    """Three training batches under a cosine schedule over four steps; writes the LR each one used."""
    with open(items_path, "rb") as f:
        batch = pickle.load(f)  # written by the test itself
    shard = _shard(rank, world_size, port, model_dir, seed=0, total_steps=4,
                   optimizer={"lr": 1e-2, "scheduler": "cosine_with_warmup"})
    algo = AlgorithmConfig(use_kl_loss=False, use_rollout_logprobs=True)
    metrics = [shard.train(batch["items"], algo, 1.0, 2, 2) for _ in range(3)]
    with open(os.path.join(out_dir, "lrs.pkl"), "wb") as f:
        pickle.dump([(m["lr"], m["optimizer_steps"]) for m in metrics], f)
    shard.shutdown()


@rank_process
def reference_then_train_bf16(rank, world_size, port, model_dir, items_path, out_dir):
    """A bf16 shard (as on GPUs) whose first pass is the reference, then one update."""
    from rl.batch import split_for_ranks

    with open(items_path, "rb") as f:
        batch = pickle.load(f)  # written by the test itself
    shard = _shard(rank, world_size, port, model_dir, seed=0, dtype="bfloat16")
    mine = split_for_ranks(batch["items"], world_size)[rank]
    ref = shard.reference_logprobs(mine, 1.0, 2)
    metrics = shard.train(mine, ALGORITHM, 1.0, 2, 1, ref)
    if rank == 0:
        pictures = {shard.pictures.key(img) for it in mine for img in it.seq.images}
        with open(os.path.join(out_dir, "result.pkl"), "wb") as f:
            pickle.dump({"metrics": metrics, "distinct_pictures": len(pictures),
                         "preprocessed": shard.pictures.processed}, f)
    shard.shutdown()
