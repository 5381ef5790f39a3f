"""The vision tower's attention over all of a batch's pictures in one SDPA call.

Qwen-VL's vision tower attends within each picture. With flash-attention, transformers hands the
pictures' boundaries to one variable-length kernel; with SDPA (this project's: flash-attn is not
a dependency) it splits the patches and calls SDPA once a picture. At gpu_scale's 8B shape that
is 320 pictures x 27 blocks = 8,640 small calls a forward pass, twice that with gradient
checkpointing, each paid for on the host: the train phase's GPU sat idle 38-59% of the time
(bench/train_profile.py). A maze's pictures all have one size, so they stack into one
(pictures, heads, patches, head_dim) batch and one call. A batch of pictures of different sizes,
or another attention implementation, takes transformers' own path.
"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from vlm.patching import replace_method


def batch_picture_attention(model) -> int:
    """Give every Qwen-VL vision attention module of `model` the one-call forward; returns how many."""
    return replace_method(model, "forward", lambda _, m: type(m).__name__.endswith("VisionAttention")
                          and _vision_rotary(m) is not None
                          and all(hasattr(m, a) for a in ("qkv", "proj", "num_heads", "scaling", "config")),
                          _one_call_forward)


def _vision_rotary(module):
    return getattr(sys.modules[type(module).__module__], "apply_rotary_pos_emb_vision", None)


def _one_call_forward(transformers_forward, module):
    rotary = _vision_rotary(module)

    def forward(self, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None, **kwargs) -> torch.Tensor:
        patches = hidden_states.shape[0]
        pictures = cu_seqlens.numel() - 1
        size = patches // pictures
        if (position_embeddings is None or self.config._attn_implementation != "sdpa" or size * pictures != patches
                or not bool((cu_seqlens.diff() == size).all())):
            return transformers_forward(self, hidden_states, cu_seqlens, position_embeddings=position_embeddings,
                                        **kwargs)
        q, k, v = self.qkv(hidden_states).reshape(patches, 3, self.num_heads, -1).permute(1, 0, 2, 3).unbind(0)
        q, k = rotary(q, k, *position_embeddings)

        def by_picture(x):  # (patches, heads, dim) -> (pictures, heads, size, dim)
            return x.reshape(pictures, size, self.num_heads, -1).transpose(1, 2)
        out = F.scaled_dot_product_attention(by_picture(q), by_picture(k), by_picture(v), scale=self.scaling)
        return self.proj(out.transpose(1, 2).reshape(patches, -1))
    return forward
