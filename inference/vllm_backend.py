"""vLLM backend (the `vllm` extra, GPU only), written against vLLM's documented offline API.

Not runnable on the machines this project is tested on (vLLM's wheel pins its own torch and
needs CUDA), so it is kept small and imported only when `generator.inference_engine.backend=vllm`.
Prompts go in as token ids with their pictures; LoRA versions are loaded with a fresh
LoRARequest id each sync, so vLLM can never serve a cached older adapter under the same id.
"""
from __future__ import annotations

from inference.requests import GenRequest, GenResult, Sampling


class VLLMBackend:
    def __init__(self, model_path: str, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.45,
                 max_lora_rank: int = 32, max_images: int = 16, engine_init_kwargs: dict | None = None):
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("generator.inference_engine.backend=vllm needs the vllm extra: "
                              "pip install 'visrl[vllm]' (GPU machines only)") from e
        kwargs = {"enable_lora": True, "max_lora_rank": max_lora_rank, "enable_sleep_mode": True,
                  "limit_mm_per_prompt": {"image": max_images}, **(engine_init_kwargs or {})}
        self.llm = LLM(model=model_path, tensor_parallel_size=tensor_parallel_size,
                       gpu_memory_utilization=gpu_memory_utilization, **kwargs)
        self.tok = self.llm.get_tokenizer()
        self.end_id = self.tok.convert_tokens_to_ids("<|im_end|>")
        self.lora = None

    def generate(self, requests: list[GenRequest], sampling: Sampling, adapter_version: int) -> list[GenResult]:
        from PIL import Image
        from vllm import SamplingParams

        params = SamplingParams(temperature=max(sampling.temperature, 0.0), top_p=sampling.top_p,
                                max_tokens=sampling.max_new_tokens, logprobs=0, seed=sampling.seed,
                                stop_token_ids=[self.end_id], stop=sampling.stop or None)
        prompts = []
        for r in requests:
            if r.messages is not None:
                raise ValueError("the vllm backend takes token-id requests; chat goes through ray.serve.llm")
            prompts.append({"prompt_token_ids": r.prompt_ids,
                            "multi_modal_data": {"image": [Image.fromarray(i) for i in r.images]}})
        outs = self.llm.generate(prompts, params, lora_request=self.lora, use_tqdm=False)
        results = []
        for r, o in zip(requests, outs):
            c = o.outputs[0]
            lps = [next(iter(d.values())).logprob if d else 0.0 for d in (c.logprobs or [])]
            results.append(GenResult(list(c.token_ids), lps, c.text,
                                     "stop" if c.finish_reason == "stop" else "length",
                                     adapter_version, len(r.prompt_ids)))
        return results

    def load_adapter(self, folder: str, version: int) -> None:
        from vllm.lora.request import LoRARequest
        self.lora = LoRARequest(f"policy-v{version}", version + 1, folder)  # ids must be > 0

    def sleep(self) -> None:
        self.llm.sleep(level=1)

    def wake_up(self) -> None:
        self.llm.wake_up()
