"""The one request/response schema every backend (and the serve app) speaks.

A request is either token ids with the pictures they refer to (multi-turn rollouts: token in,
token out) or chat messages (serving). A result carries the new token ids, their log-probs under
the sampling temperature, the text, why generation stopped and the adapter version used.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Sampling:
    max_new_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


@dataclass
class GenRequest:
    prompt_ids: list[int] | None = None
    images: list[np.ndarray] = field(default_factory=list)
    messages: list[dict] | None = None  # OpenAI-style chat (text and image parts), instead of ids


@dataclass
class GenResult:
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str  # stop | length
    adapter_version: int
    prompt_tokens: int = 0


# Markup an answer must never hold: a stray <|image_pad|> would re-enter the next prompt as a picture
# placeholder with no picture behind it. The hf engine suppresses these tokens; vLLM's answers are
# cut at the first one.
NEVER_EMIT = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_start|>")


def never_emit_ids(tokenizer) -> list[int]:
    """The ids of NEVER_EMIT and the pad token in this tokenizer (those it has)."""
    ids = tokenizer.convert_tokens_to_ids([*NEVER_EMIT, tokenizer.pad_token])
    return [i for i in ids if i is not None and i != tokenizer.unk_token_id]
