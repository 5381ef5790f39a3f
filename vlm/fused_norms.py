"""The text layers' RMSNorms as one fused kernel on the GPU.

transformers' Qwen-VL RMSNorm is written out in eight elementwise kernels (to fp32, square, mean,
add, rsqrt, multiply, back to bf16, times the weight), and there are four a layer (the two layer
norms and the query and key norms), each read and written at full width in the forward, the
recomputed forward and the backward. torch's `rms_norm` does the same in one kernel a direction,
still accumulating in fp32; the one difference is that it rounds to bf16 once, after the weight,
where transformers rounds before the weight too. The engine and the trainer load models through
`vlm.load.load_model`, so both compute the same norms. On the CPU the module keeps transformers'
path, so the CPU default's figures stay bitwise the same.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from vlm.patching import replace_method


def fuse_rms_norms(model) -> int:
    """Give every RMSNorm of `model` written as transformers' (a `weight` and a `variance_epsilon`)
    the fused forward for CUDA tensors; returns how many."""
    return replace_method(model, "forward", lambda _, m: type(m).__name__.endswith("RMSNorm") and hasattr(
        m, "variance_epsilon") and isinstance(getattr(m, "weight", None), torch.Tensor), _fused_forward)


def _fused_forward(transformers_forward, module):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not hidden_states.is_cuda or hidden_states.dtype != self.weight.dtype:
            return transformers_forward(self, hidden_states)
        return F.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight, self.variance_epsilon)
    return forward
