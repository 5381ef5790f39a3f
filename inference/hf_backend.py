"""transformers `generate` for many prompts at once: left padding, KV cache, one call a batch.

Every live episode of a turn goes into one `generate` call (in chunks of `max_batch`), whatever
its prompt length or number of pictures; log-probs are those of the temperature-scaled
distribution the tokens were sampled from, so the trainer can use them as the behaviour policy.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from inference.requests import GenRequest, GenResult, Sampling


class HFBackend:
    def __init__(self, model, processor, device: str = "cpu", max_batch: int = 256):
        self.model, self.processor, self.device, self.max_batch = model, processor, device, max_batch
        self.tok = processor.tokenizer
        self.pad_id = self.tok.pad_token_id
        self.end_id = self.tok.convert_tokens_to_ids("<|im_end|>")
        self.image_token_id = self.tok.convert_tokens_to_ids("<|image_pad|>")
        merge = getattr(processor.image_processor, "merge_size", 1)
        self.tokens_per_patch_group = merge * merge
        self.peft = None
        # Markup the model must never emit: a stray <|image_pad|> in an answer would re-enter the
        # next prompt as a picture placeholder with no picture behind it.
        self.suppress = [i for i in self.tok.convert_tokens_to_ids(
            ["<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_start|>",
             self.tok.pad_token]) if i is not None and i != self.tok.unk_token_id]

    # ---- requests -------------------------------------------------------------------------
    def _tokenize_messages(self, req: GenRequest) -> GenRequest:
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
        enc = self.processor.image_processor(images=images, return_tensors="pt")
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
        requests = [self._tokenize_messages(r) if r.messages is not None else r for r in requests]
        out = []
        for i in range(0, len(requests), self.max_batch):
            out += self._generate_chunk(requests[i:i + self.max_batch], sampling, adapter_version)
        return out

    def _generate_chunk(self, requests, sampling: Sampling, adapter_version: int) -> list[GenResult]:
        width = max(len(r.prompt_ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(requests):
            ids[row, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[row, width - len(r.prompt_ids):] = 1
        vision = self._encode_images(requests)
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        greedy = sampling.temperature <= 0
        gen = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
            mm_token_type_ids=(ids == self.image_token_id).long().to(self.device), **vision,
            max_new_tokens=sampling.max_new_tokens, do_sample=not greedy,
            temperature=None if greedy else sampling.temperature, top_p=None if greedy else sampling.top_p,
            top_k=None, eos_token_id=self.end_id, pad_token_id=self.pad_id, suppress_tokens=self.suppress,
            output_logits=True, return_dict_in_generate=True)
        new = gen.sequences[:, width:]
        # the sampled tokens' log-probs, on the device: only (batch x new tokens) values cross to the host
        logits = torch.stack(gen.logits, 1).float()
        logp = torch.log_softmax(logits / (1.0 if greedy else sampling.temperature), -1)
        logp = logp.gather(-1, new.unsqueeze(-1)).squeeze(-1).cpu()
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

    # ---- adapters and memory --------------------------------------------------------------
    def load_adapter(self, folder: str) -> None:
        """Load a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors)."""
        from peft import LoraConfig, get_peft_model, set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = Path(folder)
        config = LoraConfig(**{k: v for k, v in json.loads((folder / "adapter_config.json").read_text()).items()
                               if k in LoraConfig.__dataclass_fields__})
        state = load_file(str(folder / "adapter_model.safetensors"))
        if self.peft is None:
            config.inference_mode = True
            self.peft = get_peft_model(self.model, config)
            self.peft.eval()
            self.model = self.peft
        result = set_peft_model_state_dict(self.model, state)
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"adapter {folder} has tensors this model lacks: {result.unexpected_keys[:3]}")

    def sleep(self) -> None:
        """Move the weights into page-locked host buffers, made once and reused: a copy from pinned
        memory runs at the bus's speed (about 1 s for an 8B model), `model.to("cpu")` at a fraction."""
        if self.device == "cpu":
            return
        # keyed by parameter, not name: PEFT renames the base weights when it wraps the model
        old, self._host = getattr(self, "_host", {}), {}
        for p in self.model.parameters():
            buf = old.get(p)
            if buf is None or buf.shape != p.shape or buf.dtype != p.dtype:
                buf = torch.empty(p.shape, dtype=p.dtype, pin_memory=True)
            self._host[p] = buf.copy_(p.data, non_blocking=True)
        torch.cuda.synchronize()
        for p, buf in self._host.items():
            p.data = buf
        torch.cuda.empty_cache()

    def wake_up(self) -> None:
        if self.device == "cpu":
            return
        for p in self.model.parameters():
            p.data = p.data.to(self.device, non_blocking=True)
        torch.cuda.synchronize()
