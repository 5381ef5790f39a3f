"""Build the embedded base: a small Qwen3-VL-shaped model, its tokenizer and its processor.

The tokenizer is a byte-level BPE trained here on the task's chat (so every string encodes, and
the agent's words are single tokens; the caller gives the texts: envs.prompt.tokenizer_corpus for
the maze). The image processor uses one `cell_px` square a patch and
no spatial merge, so one maze cell is one image token, and the vision tower (bidirectional
attention over the cells) does the path finding that the causal language layers cannot.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from vlm.chat import CHAT_TEMPLATE, SPECIAL_TOKENS
from vlm.processor import ImageOnlyQwen3VLProcessor


@dataclass(frozen=True)
class EmbeddedArch:
    vocab_size: int = 512
    text_hidden: int = 128
    text_layers: int = 2
    text_heads: int = 4
    text_kv_heads: int = 2
    text_intermediate: int = 384
    vision_hidden: int = 128
    vision_layers: int = 8
    vision_heads: int = 4
    vision_intermediate: int = 384
    cell_px: int = 16          # one patch a cell
    maze_size: int = 9         # learned position grid matches the easy maze


def train_tokenizer(vocab_size: int, corpus: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE of `vocab_size` trained on `corpus` (the task's texts: its words become tokens)."""
    bpe = Tokenizer(models.BPE())
    # Action tags and words stay whole; ByteLevel keeps every byte encodable.
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s?</?action>|\s?[A-Za-z]+|\s?\d+|\s?[^\sA-Za-z\d]+|\s+"), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)


def build_processor(tokenizer, arch: EmbeddedArch) -> ImageOnlyQwen3VLProcessor:
    side = arch.cell_px
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=arch.cell_px, merge_size=1, temporal_patch_size=2,
        min_pixels=side * side, max_pixels=(64 * side) ** 2, do_resize=True)
    return ImageOnlyQwen3VLProcessor(image_processor=image_processor, tokenizer=tokenizer,
                                     chat_template=CHAT_TEMPLATE)


def special_token_ids(tokenizer) -> dict:
    """The Qwen3-VL config's ids of the picture markup, as this tokenizer numbers them."""
    return {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}


def build_config(tokenizer, arch: EmbeddedArch) -> Qwen3VLConfig:
    head_dim = arch.text_hidden // arch.text_heads
    half = head_dim // 2  # rotary pairs, split over (time, height, width) as Qwen3-VL does
    mrope = [half - 2 * (half // 3), half // 3, half // 3]
    ids = special_token_ids(tokenizer)
    return Qwen3VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=arch.text_hidden, intermediate_size=arch.text_intermediate,
            num_hidden_layers=arch.text_layers, num_attention_heads=arch.text_heads,
            num_key_value_heads=arch.text_kv_heads, head_dim=head_dim, max_position_embeddings=8192,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "mrope_section": mrope, "mrope_interleaved": True},
            tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None, eos_token_id=tokenizer.eos_token_id),
        vision_config=dict(
            depth=arch.vision_layers, hidden_size=arch.vision_hidden, intermediate_size=arch.vision_intermediate,
            num_heads=arch.vision_heads, patch_size=arch.cell_px, spatial_merge_size=1, temporal_patch_size=2,
            out_hidden_size=arch.text_hidden, num_position_embeddings=arch.maze_size ** 2,
            deepstack_visual_indexes=[arch.vision_layers // 2 - 1]),
        tie_word_embeddings=True, **ids)


def build_random_base(arch: EmbeddedArch, seed: int, corpus: list[str]):
    """Model (random init), processor with a tokenizer trained on `corpus`; deterministic for a seed."""
    torch.manual_seed(seed)
    tokenizer = train_tokenizer(arch.vocab_size, corpus)
    processor = build_processor(tokenizer, arch)
    model = Qwen3VLForConditionalGeneration(build_config(tokenizer, arch))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.config.visrl_arch = asdict(arch)
    return model, processor
