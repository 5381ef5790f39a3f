"""FSDP2 for the policy and reference shards: process groups and `fully_shard` per block.

gloo on CPU, nccl on GPU. Every decoder layer and vision block becomes its own FSDP2 unit, then
the root; frozen base weights and trainable LoRA weights shard alike (FSDP2 keeps per-parameter
requires_grad, unlike FSDP1, which also segfaults on CPU when offloading state dicts). A single
shard without offloading stays a plain module: FSDP would split nothing there, and its hooks cost
a sizeable share of a small model's train pass on a GPU (bench/record/).

`fsdp_size` (SkyRL's key) picks the shard group: -1 (or the world size) shards over every rank;
N < world makes a 2-D mesh, sharding inside groups of N consecutive ranks (one node's devices, as
the placement numbers them) and replicating across groups (hybrid sharding: gradients reduce-scatter
inside a group, then all-reduce across); 1 keeps the whole model on every rank and only all-reduces
the LoRA gradients, so the frozen base never crosses the wire.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_distributed(rank: int, world_size: int, master_addr: str, master_port: int, device: str) -> None:
    if dist.is_initialized():
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if backend == "nccl":  # Ray sets CUDA_VISIBLE_DEVICES: the actor's GPU is index 0 unless named
        torch.cuda.set_device(torch.device(device).index or 0)
    os.environ.setdefault("MASTER_ADDR", master_addr)
    os.environ.setdefault("MASTER_PORT", str(master_port))
    dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                            world_size=world_size)


def staging_device(device: str, cpu_offload: bool) -> str:
    """Where to load a model before sharding: an offloaded one on the host, since fully_shard moves
    one block at a time to the GPU and back, while a model loaded on the GPU lands there whole."""
    return "cpu" if cpu_offload else device


def mesh_shape(world_size: int, fsdp_size: int) -> tuple[int, ...]:
    """(world,) for a full shard, (replicas, fsdp_size) for hybrid sharding; a size that does not divide
    the world is a ValueError naming both."""
    if fsdp_size in (-1, world_size):
        return (world_size,)
    if fsdp_size < 1 or world_size % fsdp_size:
        raise ValueError(f"fsdp_size={fsdp_size} must be -1 or divide the {world_size} shards")
    return (world_size // fsdp_size, fsdp_size)


def group_names(mesh) -> dict[str, str]:
    """{process group name: its role}: `shard` and `replicate` for a 2-D mesh, `world` for a 1-D one."""
    if mesh is None:
        return {}
    if mesh.ndim == 1:
        return {mesh.get_group().group_name: "world"}
    return {mesh.get_group(d).group_name: d for d in mesh.mesh_dim_names}


def shard_model(model, device: str, world_size: int, cpu_offload: bool = False, bf16_compute: bool = False,
                fsdp_size: int = -1):
    """Apply FSDP2 to each transformer block, then the whole model. With bf16_compute the
    trainable (fp32) parameters are cast to bf16 for compute, with gradients reduced in fp32
    (FSDP2's MixedPrecisionPolicy). One shard that offloads nothing stays a plain module, its
    forward under bf16 autocast for the same effect: fp32 LoRA weights computing in fp32 slow the
    8B shape's train pass by a third (bench/record/). Returns the device mesh (None for a plain module)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    offload = cpu_offload and device != "cpu"
    if world_size == 1 and not offload:
        if bf16_compute:
            model.forward = torch.autocast(torch.device(device).type, dtype=torch.bfloat16)(model.forward)
            for layer in model.modules():  # PEFT would cast each LoRA input up to fp32 for autocast to cast back
                if hasattr(layer, "cast_input_dtype_enabled"):
                    layer.cast_input_dtype_enabled = False
        return None
    # the mesh names the device: FSDP2's default takes the host's accelerator, and so moved a
    # gloo (trainer.device=cpu) run onto the GPU of a machine that has one
    shape = mesh_shape(world_size, fsdp_size)
    names = ("replicate", "shard") if len(shape) == 2 else None
    mesh = init_device_mesh(torch.device(device).type, shape, mesh_dim_names=names)
    kwargs = {"mesh": mesh}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if bf16_compute:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "VisionBlock"))]
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return mesh
