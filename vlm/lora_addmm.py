"""LoRA's update added into the base layer's output by one matrix product, on the GPU.

PEFT's LoRA Linear computes `base(x) + lora_B(lora_A(dropout(x))) * scaling`: besides the matrix
products, a multiply by the scale and an add run over the full output width in the forward, and
again in the backward. In the 8B shape's train pass those elementwise kernels and the host's
dispatch of them were a large share of the time (bench/record/2026-12-06-the-8b-train-pass-without-
recompute-and-a-lost-hard-maze-run.md). `addmm(base output, x A^T, B^T, alpha=scaling)` does the
scale and the add in the product's epilogue. Only the plain case takes that path (one active
adapter, no dropout, DoRA or other variant, not merged, adapters on); anything else, and every CPU
tensor, keeps PEFT's forward, so the CPU default's figures stay bitwise the same.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vlm.patching import replace_method


def fuse_lora_updates(model) -> int:
    """Give every PEFT LoRA Linear of `model` the addmm forward for CUDA tensors; returns how many."""
    from peft.tuners.lora import Linear
    return replace_method(model, "forward", lambda _, m: isinstance(m, Linear), _addmm_forward)


def plain_lora(layer) -> str | None:
    """The one active adapter's name when `layer` computes vanilla LoRA on top of its base, else None."""
    if layer.disable_adapters or layer.merged or len(layer.active_adapters) != 1:
        return None
    name = layer.active_adapters[0]
    if (name not in layer.lora_A or name in layer.lora_variant or layer.lora_B[name].bias is not None
            or not isinstance(layer.lora_dropout[name], torch.nn.Identity)):
        return None
    return name


def addmm_update(layer, name: str, x: torch.Tensor) -> torch.Tensor:
    """`layer.base_layer(x)` plus adapter `name`'s scaled update, the add inside the second product."""
    out = layer.base_layer(x)
    low_rank = F.linear(x, layer.lora_A[name].weight)
    fused = torch.addmm(out.reshape(-1, out.shape[-1]), low_rank.reshape(-1, low_rank.shape[-1]),
                        layer.lora_B[name].weight.t(), alpha=layer.scaling[name])
    return fused.view(out.shape)


def _addmm_forward(peft_forward, module):
    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        name = plain_lora(self) if x.is_cuda and not args and not kwargs else None
        # fp32 adapter weights on bf16 activations are PEFT's to cast, unless autocast casts them
        if name is None or (self.lora_A[name].weight.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type)):
            return peft_forward(self, x, *args, **kwargs)
        return addmm_update(self, name, x)
    return forward
