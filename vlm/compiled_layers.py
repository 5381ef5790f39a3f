"""The trainer's decoder layers through torch.compile (`trainer.policy.model.compile_layers`).

At the 8B shape the train pass is paced by the host: each decoder layer's forward and backward
is hundreds of small kernel launches (the LoRA products, norms, rotary, gates, residual adds), and
the GPU waits for them a quarter of the time (bench/record/2026-12-06-the-hard-curriculum-on-three-
held-out-sets-and-lora-s-addmm-at-8b.md). Compiled, a layer's elementwise work fuses into few
kernels and its Python runs once per graph, not per op. Each layer is compiled in place with
dynamic shapes: the layers share one graph (their code is the same, their weights are inputs) and
micro-batches of any length reuse it. The first pass pays the compilation; the figures are the
compiler's, so they differ from the eager pass by rounding only.
"""
from __future__ import annotations


def decoder_layers(model) -> list:
    """The language model's decoder layers of `model` (any wrapping: PEFT, FSDP)."""
    return [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]


def compile_decoder_layers(model) -> int:
    """torch.compile each decoder layer of `model` in place (dynamic shapes); returns how many."""
    layers = decoder_layers(model)
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)
