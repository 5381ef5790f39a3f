"""vLLM backend: the `vllm` extra on GPU machines, vLLM's CPU build (`make vllm-setup`) elsewhere.

It speaks the same token-in, token-out schema as the hf backend, so `RolloutRunner` and the
trainer see no difference. Where vLLM's defaults would make it disagree with the hf backend and
the trainer, it is told otherwise:
- a prompt holds one `<|image_pad|>` per picture: vLLM expands each placeholder to the picture's
  patch count itself, so the runs of pads our prompts carry are collapsed first;
- every request has its own seed (`request_seed`): one `SamplingParams(seed=...)` for the batch
  would give every request the same random stream, and a GRPO group identical samples;
- log-probs are `processed_logprobs`, those of the distribution sampled from (temperature
  applied), not vLLM's default raw ones;
- markup the model must never emit (picture placeholders, a new message) ends an answer where it
  appears, and is dropped. The hf backend bans it while sampling; vLLM's `bad_words` would do the
  same but renormalises the reported log-probs away from the trainer's (by ~1e-3 on the embedded
  base) and made greedy rollouts 4x slower here;
- sleep/wake only where the platform has sleep mode (CUDA, ROCm, XPU); on the CPU they are no-ops;
- on the CPU, the KV cache size and the cores to bind come from config (vLLM would otherwise take
  45% of RAM and, on a small machine, one core), and chunked prefill is off: a seeded request
  split over two prefill chunks needs a generator offset that the CPU generator lacks.
Each adapter version gets a fresh LoRA id, so vLLM can never serve a cached older version.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from inference.requests import GenRequest, GenResult, Sampling, never_emit_ids


class AdapterRankError(ValueError):
    pass


def collapse_image_pads(ids: list[int], pad_id: int) -> list[int]:
    """One placeholder per picture: each run of `pad_id` becomes a single `pad_id`."""
    return [t for i, t in enumerate(ids) if t != pad_id or i == 0 or ids[i - 1] != pad_id]


def request_seed(batch_seed: int, index: int) -> int:
    """A seed per request: spread so that nearby batch seeds (the rollout seeds each turn with
    seed * 131 + turn) never hand two requests the same random stream."""
    return (batch_seed * 1_000_003 + index) % 2**63


def cpu_env(threads: int | None) -> dict:
    """The environment vLLM's CPU engine reads at start: bind `threads` of the cores this process may
    use (all by default); without it the worker drops to one thread."""
    allowed = sorted(os.sched_getaffinity(0))
    n = min(threads or len(allowed), len(allowed))
    bind = "nobind" if n == len(allowed) else ",".join(str(c) for c in allowed[:n])
    return {"VLLM_CPU_OMP_THREADS_BIND": bind, "OMP_NUM_THREADS": str(n)}


def engine_kwargs(on_cpu: bool, max_lora_rank: int, max_loras: int = 1, cpu_kv_cache_gib: float = 2.0,
                  extra: dict | None = None) -> dict:
    """vLLM engine arguments shared by the rollout engine and the ray.serve.llm app; `extra` wins."""
    # enable_tower_connector_lora: without it vLLM drops an adapter's vision-tower layers with a
    # warning, and an all-linear adapter (the reference config) answered 0/320 turns as hf did.
    kwargs = {"enable_lora": True, "max_lora_rank": max_lora_rank, "max_loras": max_loras,
              "enable_tower_connector_lora": True}
    if on_cpu:
        kwargs |= {"kv_cache_memory_bytes": int(cpu_kv_cache_gib * 2**30), "enable_chunked_prefill": False}
    return kwargs | (extra or {})


class VLLMBackend:
    def __init__(self, model_path: str, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.45,
                 max_lora_rank: int = 32, max_images: int = 16, dtype: str = "bfloat16", seed: int = 0,
                 cpu_kv_cache_gib: float = 2.0, cpu_threads: int | None = None,
                 engine_init_kwargs: dict | None = None):
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as e:
            raise ImportError("generator.inference_engine.backend=vllm needs vLLM: pip install 'visrl[vllm]' on a "
                              "GPU machine, or `make vllm-setup` (vLLM's CPU build in .venv-vllm)") from e
        self.on_cpu = current_platform.is_cpu()
        self.can_sleep = current_platform.is_sleep_mode_available()
        self.max_lora_rank = max_lora_rank
        if self.on_cpu:
            os.environ.update(cpu_env(cpu_threads))  # read by the engine processes vLLM starts
        kwargs = {"dtype": dtype, "limit_mm_per_prompt": {"image": max_images}, "seed": seed,
                  "logprobs_mode": "processed_logprobs", "enable_sleep_mode": self.can_sleep}
        kwargs |= engine_kwargs(self.on_cpu, max_lora_rank, 1, cpu_kv_cache_gib, engine_init_kwargs)
        self.llm = LLM(model=model_path, tensor_parallel_size=tensor_parallel_size,
                       gpu_memory_utilization=gpu_memory_utilization, **kwargs)
        self.tok = self.llm.get_tokenizer()
        self.end_id = self.tok.convert_tokens_to_ids("<|im_end|>")
        self.image_pad_id = self.tok.convert_tokens_to_ids("<|image_pad|>")
        self.never_emit = set(never_emit_ids(self.tok))
        self.lora = None

    def generate(self, requests: list[GenRequest], sampling: Sampling, adapter_version: int) -> list[GenResult]:
        from PIL import Image
        from vllm import SamplingParams

        greedy = sampling.temperature <= 0
        params, prompts = [], []
        for i, r in enumerate(requests):
            if r.messages is not None:
                raise ValueError("the vllm backend takes token-id requests; chat goes through ray.serve.llm")
            params.append(SamplingParams(
                temperature=0.0 if greedy else sampling.temperature, top_p=1.0 if greedy else sampling.top_p,
                max_tokens=sampling.max_new_tokens, logprobs=0, stop_token_ids=[self.end_id],
                stop=sampling.stop or None, skip_special_tokens=True,
                seed=None if sampling.seed is None else request_seed(sampling.seed, i)))
            prompt = {"prompt_token_ids": collapse_image_pads(r.prompt_ids, self.image_pad_id)}
            if r.images:
                prompt["multi_modal_data"] = {"image": [Image.fromarray(img) for img in r.images]}
            prompts.append(prompt)
        outs = self.llm.generate(prompts, params, lora_request=self.lora, use_tqdm=False)
        results = []
        for r, o in zip(requests, outs):
            c = o.outputs[0]
            toks = list(c.token_ids)
            lps = [d[t].logprob for t, d in zip(toks, c.logprobs or [])]
            finish, text = ("stop" if c.finish_reason == "stop" else "length"), c.text
            cut = next((k for k, t in enumerate(toks) if t in self.never_emit), None)
            if cut is not None:
                toks, lps, finish = toks[:cut], lps[:cut], "length"
                text = self.tok.decode(toks, skip_special_tokens=True)
            results.append(GenResult(toks, lps, text, finish, adapter_version, len(r.prompt_ids)))
        return results

    def shutdown(self) -> None:
        """Stop the engine core process and its workers: they outlive a parent that exits without this."""
        self.llm.llm_engine.engine_core.shutdown()

    def load_adapter(self, folder: str, version: int) -> None:
        from vllm.lora.request import LoRARequest
        rank = json.loads((Path(folder) / "adapter_config.json").read_text())["r"]
        if rank > self.max_lora_rank:
            raise AdapterRankError(f"adapter {folder} has LoRA rank {rank}, above the engine's max_lora_rank "
                                   f"{self.max_lora_rank}: raise trainer.policy.model.lora.rank's engine limit "
                                   "or train a smaller adapter")
        previous, self.lora = self.lora, LoRARequest(f"policy-v{version}", version + 1, folder)  # ids must be > 0
        # loaded now, not on the next generate: a sync's cost shows in sync/adapter_load_s, and the
        # older version leaves the engine's LoRA slots (its id is never asked for again)
        engine = self.llm.llm_engine
        engine.add_lora(self.lora)
        if previous is not None and previous.lora_int_id != self.lora.lora_int_id:
            engine.remove_lora(previous.lora_int_id)

    def sleep(self) -> None:
        if self.can_sleep:
            self.llm.sleep(level=1)

    def wake_up(self) -> None:
        if self.can_sleep:
            self.llm.wake_up()
