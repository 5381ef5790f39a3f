"""transformers models generating for many prompts at once: left padding, KV cache, one call a batch.

Every live episode of a turn goes into one call (in chunks of `max_batch`), whatever its prompt
length or number of pictures: transformers' `generate`, or on a GPU the engine's own decode loop
replayed as CUDA graphs (inference/graph_decode.py). Log-probs are those of the temperature-scaled
distribution the tokens were sampled from, so the trainer can use them as the behaviour policy.
"""
from __future__ import annotations

import json
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

from inference.graph_decode import GraphDecoder, missing_internals
from inference.host_copy import pinned_copies
from inference.pictures import PicturePreprocessor
from inference.requests import GenRequest, GenResult, Sampling, never_emit_ids


def distinct_prompts(requests: list[GenRequest]) -> tuple[list[GenRequest], torch.Tensor]:
    """(the distinct requests, each request's row among them). A group's samples share their first
    prompt (and a maze's episodes their early turns): each distinct prompt is prefilled once."""
    index, prompts, rows = {}, [], []
    for r in requests:
        key = (tuple(r.prompt_ids), tuple(PicturePreprocessor.key(p) for p in r.images))
        if key not in index:
            index[key] = len(prompts)
            prompts.append(r)
        rows.append(index[key])
    return prompts, torch.tensor(rows)


class HFBackend:
    def __init__(self, model, processor, device: str = "cpu", max_batch: int = 256, merge_lora: bool = False,
                 picture_cache_bytes: int = 1 << 30, decode_loop: str = "hf", patch_lora=None):
        self.model, self.processor, self.device, self.max_batch = model, processor, device, max_batch
        # applied to the model once PEFT has made its LoRA layers: the engine passes vlm/lora_addmm.py's
        # patch (each update added by one addmm on a GPU, as the trainer does: fewer kernels a decode
        # step, and the engine's LoRA arithmetic the trainer's)
        self.patch_lora = patch_lora
        self.merge_lora = merge_lora and device != "cpu"
        # graphs: the GraphDecoder's loop replayed as CUDA graphs (GPU only; the CPU keeps `generate`),
        # for one adapter at a time: a graph replays the LoRA layers that were active when it was
        # captured, so a server switching adapters per request keeps hf; eager: the same loop without
        # graphs; hf: transformers' `generate`
        if decode_loop not in ("graphs", "eager", "hf"):
            raise ValueError(f"decode_loop must be graphs, eager or hf, not {decode_loop!r}")
        self.decode_loop = "hf" if decode_loop == "graphs" and device == "cpu" else decode_loop
        missing = missing_internals(model) if self.decode_loop != "hf" else []
        if missing:  # a transformers release that renamed them: the model still runs, through `generate`
            warnings.warn(f"the hf engine's own decode loop needs {', '.join(missing)}, which this model "
                          f"({type(model).__name__}) lacks; decoding with transformers' generate instead", stacklevel=2)
            self.decode_loop = "hf"
        self.decoder = None  # the GraphDecoder over the current model (built on first use)
        self.tok = processor.tokenizer
        self.pad_id = self.tok.pad_token_id
        self.end_id = self.tok.convert_tokens_to_ids("<|im_end|>")
        self.image_token_id = self.tok.convert_tokens_to_ids("<|image_pad|>")
        merge = getattr(processor.image_processor, "merge_size", 1)
        self.tokens_per_patch_group = merge * merge
        self.pictures = PicturePreprocessor(processor.image_processor, model.dtype, picture_cache_bytes)
        self.peft = None
        self._base = None  # GPU only: the unmerged base weights, page-locked on the host
        self.gpu_weights = "base"  # base | merged (the adapter added in) | host (asleep)
        self.suppress = never_emit_ids(self.tok)

    # ---- requests -------------------------------------------------------------------------
    def tokenize_messages(self, req: GenRequest) -> GenRequest:
        """A chat-messages request as token ids and pictures, through the model's chat template."""
        images, content_messages = [], []
        for m in req.messages:
            content = m["content"]
            if isinstance(content, list):
                parts = []
                for p in content:
                    if p.get("type") in ("image", "image_url"):
                        images.append(p["image"])
                        parts.append({"type": "image"})
                    else:
                        parts.append(p)
                content = parts
            content_messages.append({"role": m["role"], "content": content})
        text = self.processor.apply_chat_template(content_messages, add_generation_prompt=True, tokenize=False)
        enc = self.processor(text=[text], images=images or None, return_tensors="pt")
        return GenRequest(prompt_ids=enc["input_ids"][0].tolist(), images=images)

    def _encode_images(self, requests):
        images = [img for r in requests for img in r.images]
        if not images:
            return {}
        enc = self.pictures(images, self.device)
        grid = enc["image_grid_thw"]
        counts = (grid.prod(-1) // self.tokens_per_patch_group).tolist()
        i = 0
        for r in requests:  # a picture must never be cut: placeholders and features must agree
            want = sum(counts[i:i + len(r.images)])
            i += len(r.images)
            have = sum(1 for t in r.prompt_ids if t == self.image_token_id)
            if want != have:
                raise ValueError(f"prompt holds {have} image tokens but its {len(r.images)} picture(s) "
                                 f"need {want}; was the prompt truncated inside a picture?")
        return {"pixel_values": enc["pixel_values"].to(self.device, self.model.dtype),
                "image_grid_thw": grid.to(self.device)}

    @torch.no_grad()
    def generate(self, requests: list[GenRequest], sampling: Sampling, adapter_version: int) -> list[GenResult]:
        requests = [self.tokenize_messages(r) if r.messages is not None else r for r in requests]
        out = []
        for i in range(0, len(requests), self.max_batch):
            out += self._generate_chunk(requests[i:i + self.max_batch], sampling, adapter_version)
        return out

    def _generate_chunk(self, requests, sampling: Sampling, adapter_version: int) -> list[GenResult]:
        self._prepare_weights()
        own_loop = self.decode_loop != "hf" and sampling.top_p >= 1  # top-p: `generate` samples it
        prompts, rows = distinct_prompts(requests) if own_loop else (requests, None)
        width = max(len(r.prompt_ids) for r in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(prompts):
            ids[row, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[row, width - len(r.prompt_ids):] = 1
        vision = self._encode_images(prompts)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        ids, mask = ids.to(self.device), mask.to(self.device)
        extra = {"mm_token_type_ids": (ids == self.image_token_id).long(), **vision}
        new, logp = self._decode(ids, mask, extra, sampling, rows)
        logp = logp.cpu()
        new = new.cpu()
        results = []
        for row, r in enumerate(requests):
            toks = new[row].tolist()
            end = toks.index(self.end_id) + 1 if self.end_id in toks else len(toks)
            toks, lps = toks[:end], logp[row, :end].tolist()
            text = self.tok.decode(toks, skip_special_tokens=True)
            finish = "stop" if toks and toks[-1] == self.end_id else "length"
            for s in sampling.stop:  # OpenAI-style stop strings cut the text (not the ids)
                if s and s in text:
                    text, finish = text[:text.index(s)], "stop"
            results.append(GenResult(toks, lps, text, finish, adapter_version, len(r.prompt_ids)))
        return results

    def _decode(self, ids, mask, extra, sampling: Sampling, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill and sample: ([sequences, new] token ids, their log-probs), both on the device.
        `rows` (own loop only): the prompt each sequence continues."""
        if rows is not None:
            if self.decoder is None:
                self.decoder = GraphDecoder(self.model, use_graphs=self.decode_loop == "graphs")
            return self.decoder.generate(ids, mask, extra, sampling.max_new_tokens, sampling.temperature,
                                         self.suppress, self.end_id, rows.to(self.device))
        greedy = sampling.temperature <= 0
        gen = self.model.generate(
            input_ids=ids, attention_mask=mask, **extra,
            max_new_tokens=sampling.max_new_tokens, do_sample=not greedy,
            temperature=None if greedy else sampling.temperature, top_p=None if greedy else sampling.top_p,
            top_k=None, eos_token_id=self.end_id, pad_token_id=self.pad_id, suppress_tokens=self.suppress,
            output_logits=True, return_dict_in_generate=True)
        new = gen.sequences[:, ids.shape[1]:]
        # the sampled tokens' log-probs, on the device: only (batch x new tokens) values cross to the host
        logits = torch.stack(gen.logits, 1).float()
        logp = torch.log_softmax(logits / (1.0 if greedy else sampling.temperature), -1)
        return new, logp.gather(-1, new.unsqueeze(-1)).squeeze(-1)

    # ---- adapters and memory --------------------------------------------------------------
    # On a GPU the unmerged base lives in one page-locked host copy: sleeping drops the GPU's
    # weights (the adapter's small tensors stay) and waking copies the base back, at the bus's
    # speed. With merge_lora each adapter version is merged into the weights (W + B A) before the
    # next generate, so decoding runs the plain model instead of two extra matmuls per linear layer
    # and step; a new version restores the base from the copy first (never subtracting B A, which
    # would drift over versions). The price: W + B A rounded to bf16 is not what the trainer
    # computes (docs/configuration.md). On the CPU neither applies.
    def load_adapter(self, folder: str) -> None:
        """The rollouts' adapter: a new version of the one adapter, in place of the last."""
        self.add_adapter("default", folder)

    def add_adapter(self, name: str, folder: str) -> None:
        """Load a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) as `name`,
        in place of an adapter of that name (the serve app keeps several, by name)."""
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = Path(folder)
        config = LoraConfig(**{k: v for k, v in json.loads((folder / "adapter_config.json").read_text()).items()
                               if k in LoraConfig.__dataclass_fields__})
        config.inference_mode = True
        state = load_file(str(folder / "adapter_model.safetensors"))
        if self.peft is None:
            if self.merge_lora:
                self._keep_base_copy()  # before PEFT wraps the model: every parameter now is the base
            # the adapter in the base's dtype: PEFT's default fp32 adapter made every decode step on a
            # bf16 GPU model cast activations to fp32 and back around fp32 matmuls in each LoRA layer
            self.peft = get_peft_model(self.model, config, adapter_name=name, autocast_adapter_dtype=False)
            self.peft.eval()
            if self.patch_lora is not None:
                self.patch_lora(self.peft)
            self.model = self.peft
            self.decoder = None  # its graphs were captured without the LoRA layers
        elif name not in self.peft.peft_config:
            self.peft.add_adapter(name, config)
            self.peft.eval()
        if self.gpu_weights == "merged":
            self._restore_base()
        result = set_peft_model_state_dict(self.model, state, adapter_name=name)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"adapter {folder} has tensors this model lacks: {result.unexpected_keys[:3]}")

    def remove_adapter(self, name: str) -> None:
        self.peft.delete_adapter(name)

    @contextmanager
    def adapter(self, name: str | None):
        """Generate with adapter `name`, or with the base where it is None."""
        if self.peft is None:
            yield
        elif name is None:
            with self.peft.disable_adapter():
                yield
        else:
            self.peft.set_adapter(name)
            yield

    def _prepare_weights(self) -> None:
        """Before a generate on a GPU: the current adapter merged into the base."""
        if not self.merge_lora or self.peft is None or self.gpu_weights == "merged":
            return
        if self.gpu_weights == "host":
            self._restore_base()
        from peft.tuners.tuners_utils import BaseTunerLayer
        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                module.merged_adapters = []  # the weights hold the base alone
        self.model.merge_adapter()
        self.gpu_weights = "merged"

    def _keep_base_copy(self) -> None:
        if self.device != "cpu" and self._base is None:
            self._base = pinned_copies(self.model.parameters())

    def _restore_base(self) -> None:
        for p, host in self._base.items():
            if p.device.type == "cpu":
                p.data = host.to(self.device, non_blocking=True)
            else:
                p.data.copy_(host, non_blocking=True)
        torch.cuda.synchronize()
        self.gpu_weights = "base"

    def sleep(self) -> None:
        """Free the GPU's copy of the weights the host copy holds (made on the first sleep, or before
        the first adapter with merge_lora)."""
        if self.device == "cpu":
            return
        self._keep_base_copy()
        for p, host in self._base.items():
            p.data = host
        self.gpu_weights = "host"
        if self.decoder is not None:
            self.decoder.drop()  # its graphs read the weights where they were
        torch.cuda.empty_cache()

    def wake_up(self) -> None:
        if self.device != "cpu" and self.gpu_weights == "host":
            self._restore_base()
