"""The vision tower's patch embedding as one matrix product.

Qwen-VL embeds each patch with a Conv3d whose kernel equals its stride, applied to patches the
processor has already cut out and flattened: the convolution is a linear map of each flattened
patch. torch runs it as a 3-D convolution all the same, and on the CPU that was 7% of a rollout of
the CPU default (mkldnn's conv3d, 22 ms a call for a micro-batch's pictures) where a matrix
product of the same numbers takes a fraction of it. The weights stay the Conv3d's (checkpoints and
adapters are unchanged); a patch embedding that is not a plain Conv3d (a LoRA on it, another
kernel) keeps transformers' path.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vlm.patching import replace_method


def embed_patches_by_matmul(model) -> int:
    """Give every Qwen-VL vision patch embedding (a `proj` Conv3d) of `model` the matrix-product forward; returns how many."""
    return replace_method(model, "forward", lambda _, m: type(m).__name__.endswith("PatchEmbed")
                          and _patchwise(getattr(m, "proj", None)), _matmul_forward)


def _patchwise(proj) -> bool:
    """A Conv3d that sees each patch once (kernel = stride, no padding): a linear map of each patch."""
    return (isinstance(proj, torch.nn.Conv3d) and tuple(proj.kernel_size) == tuple(proj.stride)
            and proj.padding == (0, 0, 0))


def _matmul_forward(transformers_forward, module):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        proj = self.proj
        if type(proj) is not torch.nn.Conv3d:  # wrapped after the patch (a LoRA on it): its own forward
            return transformers_forward(self, hidden_states)
        weight = proj.weight.reshape(proj.out_channels, -1)
        return F.linear(hidden_states.reshape(-1, weight.shape[1]).to(weight.dtype), weight, proj.bias)
    return forward
