"""The policy shard takes turns with colocated engines: offload() moves its weights to host memory and
frees the GPU's copy while the engines generate; the next call that needs them brings them back, and
the shard then trains exactly as one that never left the GPU. One device's model keeps one
page-locked copy of its frozen base for every offload.

Needs CUDA: skipped elsewhere (CI has no GPU); on a GPU machine run `python -m pytest tests/on_gpu`.
"""
import pytest
import torch

from actors.policy_shard import FSDPPolicyShard
from net import free_port
from tests.fsdp_worker import ALGORITHM
from tests.helpers import make_items

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def lora(shard) -> dict:
    return {n: p.detach().cpu().clone() for n, p in shard.model.named_parameters() if p.requires_grad}


def test_an_offloaded_shard_frees_its_weights_and_trains_as_one_never_offloaded(tiny_model_dir):
    batch = make_items(tiny_model_dir)
    port = free_port()
    stays, moves = (FSDPPolicyShard(tiny_model_dir, device="cuda", dtype="bfloat16", lora={"rank": 4, "alpha": 8},
                                    optimizer={"lr": 1e-2}, seed=0) for _ in range(2))
    for shard in (stays, moves):
        shard.setup("127.0.0.1", port)  # one process: the second joins the first's group of one
        shard.train(batch["items"], ALGORITHM, 1.0, 2, 1, batch["ref"])

    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    weights = sum(p.numel() * p.element_size() for p in moves.model.parameters())
    assert moves.offload() * 2**30 == pytest.approx(weights)
    assert all(p.device.type == "cpu" for p in moves.model.parameters())
    assert held - torch.cuda.memory_allocated() >= weights  # the GPU's copy is gone, not just unused

    # one device's model keeps one pinned copy of its frozen base: a later offload copies nothing back
    frozen = [p for p in moves.model.parameters() if not p.requires_grad]
    first_copies = [p.data.data_ptr() for p in frozen]
    assert all(p.data.is_pinned() for p in frozen)
    moves.reload()
    assert moves.offload() > 0 and [p.data.data_ptr() for p in frozen] == first_copies

    # the next train brings the weights back by itself: both shards take their second step alike
    second = [shard.train(batch["items"], ALGORITHM, 1.0, 2, 1, batch["ref"]) for shard in (stays, moves)]
    assert not moves.offloaded and all(p.device.type == "cuda" for p in moves.model.parameters())
    for key in ("policy_loss", "policy_kl", "grad_norm", "entropy"):
        assert second[1][key] == pytest.approx(second[0][key], rel=1e-5, abs=1e-7), key
    after_stays, after_moves = lora(stays), lora(moves)
    for name, value in after_stays.items():
        torch.testing.assert_close(after_moves[name], value, rtol=0, atol=0)
    assert any((v != 0).any() for n, v in after_moves.items() if "lora_B" in n)  # the updates did happen


def test_a_shard_started_as_the_driver_starts_it_grows_its_segments(tiny_model_dir):
    """controller/launch.py starts a GPU policy shard with growable allocator segments: the segments
    its process holds after a train step are expandable ones."""
    ray = pytest.importorskip("ray")
    from controller.runtime_env import allocator_options

    ray.init(num_gpus=1, include_dashboard=False)
    try:
        shard = ray.remote(FSDPPolicyShard).options(num_gpus=1, **allocator_options("policy", "hf", True, set())).remote(
            tiny_model_dir, device="cuda", dtype="bfloat16", lora={"rank": 4, "alpha": 8}, seed=0)
        ray.get(shard.setup.remote("127.0.0.1", free_port()))
        batch = make_items(tiny_model_dir)
        ray.get(shard.train.remote(batch["items"], ALGORITHM, 1.0, 2, 1, batch["ref"]))
        segments = ray.get(shard.__ray_call__.remote(lambda self: [s["is_expandable"] for s in torch.cuda.memory_snapshot()]))
    finally:
        ray.shutdown()
    assert segments and all(segments)
