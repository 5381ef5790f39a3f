"""VLLMEngine: one rollout engine per device, with the `hf` or `vllm` backend.

It owns the base weights and the current LoRA version. Every result carries the version it was
produced with, and a generate call can demand a version: a mismatch is an error, never a silent
rollout on stale weights (the bug most reported across RL frameworks). While asleep (colocated
shards are training) it refuses to generate rather than fight them for memory.
"""
from __future__ import annotations

import time

import torch

from inference.requests import GenRequest, GenResult, Sampling
from settings import Config
from storage.adapters import AdapterRef


class StaleAdapterError(RuntimeError):
    pass


def engine_settings(cfg: Config) -> dict:
    """VLLMEngine's keyword arguments from a run's config, beyond model and device."""
    eng = cfg.generator.inference_engine
    speedups = cfg.trainer.policy.model.speedups
    settings = {"backend": eng.backend, "s3_cfg": cfg.s3}
    if eng.backend == "vllm":
        # vLLM sizes its profiling run by the most pictures a prompt may hold
        g = cfg.generator
        settings |= {"max_images": g.context_pictures or g.context_window_turns or g.max_turns,
                     "tensor_parallel_size": eng.tensor_parallel_size, "seed": cfg.trainer.seed,
                     "gpu_memory_utilization": eng.gpu_memory_utilization, "cpu_kv_cache_gib": eng.cpu_kv_cache_gib,
                     "max_lora_rank": cfg.trainer.policy.model.lora.rank,
                     "engine_init_kwargs": dict(eng.engine_init_kwargs)}
    else:
        # a picture recurs in later prompts only when more than the last one is kept
        settings |= {"merge_lora": eng.merge_lora, "speedups": speedups,
                     "decode_loop": "graphs" if eng.cuda_graphs and speedups else "hf",
                     "picture_cache_bytes": 0 if cfg.generator.context_pictures == 1 else 1 << 30}
    return settings


class VLLMEngine:
    def __init__(self, model_path: str, backend: str = "hf", device: str = "cpu", rank: int = 0,
                 dtype: str = "float32", s3_cfg=None, threads: int | None = None, **vllm_kwargs):
        self.rank, self.backend_name, self.device = rank, backend, device
        if threads:
            torch.set_num_threads(threads)
        if backend == "vllm":
            from inference.vllm_backend import VLLMBackend
            from vlm.load import resolve_model_path
            self.backend = VLLMBackend(resolve_model_path(model_path, s3_cfg), dtype=dtype, cpu_threads=threads,
                                       **vllm_kwargs)
        else:
            from inference.hf_backend import HFBackend
            from vlm.load import load_model
            from vlm.lora_addmm import fuse_lora_updates
            speedups = vllm_kwargs.get("speedups", True)
            model, processor = load_model(model_path, device, getattr(torch, dtype), s3_cfg, speedups=speedups)
            self.backend = HFBackend(model, processor, device, merge_lora=vllm_kwargs.get("merge_lora", False),
                                     picture_cache_bytes=vllm_kwargs.get("picture_cache_bytes", 1 << 30),
                                     decode_loop=vllm_kwargs.get("decode_loop", "graphs"),
                                     patch_lora=fuse_lora_updates if speedups else None)
        self.adapter_version = 0  # 0 = the base model, no adapter
        self.adapter_path = None
        self.asleep = False
        self.last_load_s = 0.0
        # the GPU memory this engine's processes hold (vLLM's engine core is a child process), awake
        # and asleep: what sleep frees for the colocated shards (None without a GPU)
        self.memory_gib = {"awake": self._memory(), "asleep": None}

    def generate(self, requests: list[GenRequest], sampling: Sampling,
                 expect_version: int | None = None) -> list[GenResult]:
        if self.asleep:
            raise RuntimeError(f"VLLMEngine-{self.rank} is asleep; call wake_up() before generating")
        if expect_version is not None and expect_version != self.adapter_version:
            raise StaleAdapterError(f"VLLMEngine-{self.rank} holds adapter v{self.adapter_version}, "
                                    f"rollout expects v{expect_version}: weights were not synced")
        return self.backend.generate(requests, sampling, self.adapter_version)

    def load_adapter(self, ref: AdapterRef) -> int:
        """Load an adapter version; returns the version now loaded."""
        version = ref.version
        if version < self.adapter_version:
            raise StaleAdapterError(f"VLLMEngine-{self.rank}: refusing to go back from v{self.adapter_version} "
                                    f"to v{version}")
        start = time.perf_counter()
        if self.backend_name == "vllm":
            self.backend.load_adapter(ref.path, version)
        else:
            self.backend.load_adapter(ref.path)
        self.adapter_version, self.adapter_path = version, ref.path
        self.last_load_s = time.perf_counter() - start
        return version

    def sleep(self) -> None:
        if not self.asleep:
            self.memory_gib["awake"] = self._memory()
            self.backend.sleep()
            self.asleep = True
            self.memory_gib["asleep"] = self._memory()

    def wake_up(self) -> None:
        if self.asleep:
            self.backend.wake_up()
            self.asleep = False

    def shutdown(self) -> None:
        """Free what the engine holds outside this process (vLLM's engine core); the hf engine holds nothing there."""
        if self.backend_name == "vllm":
            self.backend.shutdown()

    def _memory(self) -> float | None:
        if self.device != "cuda":
            return None
        from telemetry.gpu import process_tree_memory_gib
        return process_tree_memory_gib()

    def peak_memory_gib(self) -> float:
        from vlm.load import peak_memory_gib
        return peak_memory_gib()

    def status(self) -> dict:
        return {"rank": self.rank, "adapter_version": self.adapter_version, "asleep": self.asleep,
                "backend": self.backend_name, "last_adapter_load_s": self.last_load_s,
                "memory_awake_gib": self.memory_gib["awake"], "memory_asleep_gib": self.memory_gib["asleep"]}
