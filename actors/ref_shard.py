"""RefShard: the frozen starting model, sharded with FSDP2, scoring sampled tokens for the KL term.

With `trainer.ref.fsdp_config.cpu_offload` its parameters live in host memory between uses (on
GPUs; on the CPU default there is nothing to offload). Not created when use_kl_loss is off.
"""
from __future__ import annotations

import numpy as np
import torch

from vlm.forward import score_seqs
from vlm.sharding import init_distributed, shard_model, staging_device


class RefShard:
    def __init__(self, model_path: str, rank: int = 0, world_size: int = 1, device: str = "cpu",
                 cpu_offload: bool = False, s3_cfg=None, threads: int | None = None, dtype: str = "float32",
                 speedups: bool = True, fsdp_size: int = -1, max_tokens_per_micro_batch: int = 0):
        self.model_path, self.rank, self.world_size, self.device = model_path, rank, world_size, device
        self.speedups, self.fsdp_size, self.max_tokens = speedups, fsdp_size, max_tokens_per_micro_batch
        self.cpu_offload, self.s3_cfg, self.dtype = cpu_offload, s3_cfg, getattr(torch, dtype)
        if threads:
            torch.set_num_threads(threads)

    def address(self) -> tuple[str, int]:
        from net import free_port, node_ip
        return node_ip(), free_port("")

    def setup(self, master_addr: str = "127.0.0.1", master_port: int = 29501) -> None:
        from vlm.load import load_model
        init_distributed(self.rank, self.world_size, master_addr, master_port, self.device)
        self.model, self.processor = load_model(self.model_path, staging_device(self.device, self.cpu_offload), self.dtype,
                                                self.s3_cfg, speedups=self.speedups)
        for p in self.model.parameters():
            p.requires_grad_(False)
        shard_model(self.model, self.device, self.world_size, self.cpu_offload, fsdp_size=self.fsdp_size)

    def logprobs(self, items: list, temperature: float = 1.0, micro_batch: int = 16) -> dict[int, np.ndarray]:
        """{item key: the reference's log-probs of its sampled tokens}."""
        from vlm.load import release_cached_memory
        scored = score_seqs(self.model, self.processor, [it.seq for it in items], micro_batch, self.device,
                            self.dtype, temperature, self.world_size, max_tokens=self.max_tokens)
        release_cached_memory(self.device)
        return {it.key: lp for it, lp in zip(items, scored)}

    def peak_memory_gib(self) -> float:
        from vlm.load import peak_memory_gib
        return peak_memory_gib()
