"""A decode loop that owns its buffers, so a GPU can replay each decode step as one CUDA graph.

transformers' `generate` launches every kernel of every decode step from Python: on a GPU an
8B model's decode step spends several times more host time than GPU work (bench/record/ ("Where a
rollout's time goes")), and `generate` cannot run under CUDA graphs because it keeps no buffers of
its own. Here the prompt is prefilled by the model's own forward (pictures, deepstack, M-RoPE),
its KV cache is copied into fixed buffers, and each new token runs one step of the text decoder
written out over the model's own modules (norms, projections with their LoRA layers, MLP,
rotary embedding), reading and writing only those buffers. On a GPU that step is captured once
per (batch, cache length) bucket and replayed; on the CPU it runs eagerly (the tests compare it
with `generate` there). A prompt that several sequences continue (a group's first turn) is
prefilled once and its cache copied to each of them.

What is simplified: every row decodes `max_new_tokens` steps (rows that ended keep going and their
tokens are dropped; a check every 8 steps stops early once all have ended); top-p sampling is left
to `generate` (the caller falls back).
"""
from __future__ import annotations

import sys
import time
from collections import OrderedDict
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# cuDNN first: a bucket's shapes never change, so it plans each once (vlm/load.py leaves cuDNN off for
# the ever-new shapes of prefill and training), and without it attention over grouped KV heads with
# a mask falls to the math kernel, half again slower at 8B (bench/record/)
DECODE_ATTENTION = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.MATH]


# What the decode step reads of transformers' Qwen3-VL modules (and the prefill of its outputs): a release
# that renames one would break the loop, so HFBackend checks them at load and falls back to `generate`.
TEXT_MODEL = ("embed_tokens", "rotary_emb", "layers", "norm", "config")
DECODER_LAYER = ("self_attn", "input_layernorm", "post_attention_layernorm", "mlp")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "head_dim", "scaling")


def missing_internals(model) -> list[str]:
    """The internals the decode loop needs that `model` lacks (empty: the loop can run over it)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    missing = [name for name in ("model.language_model", "lm_head") if _lookup(base, name) is None]
    text = _lookup(base, "model.language_model")
    if text is not None:
        missing += [f"language_model.{a}" for a in TEXT_MODEL if not hasattr(text, a)]
        layers = list(getattr(text, "layers", []))[:1]
        for layer in layers:
            missing += [f"layers[0].{a}" for a in DECODER_LAYER if not hasattr(layer, a)]
            attn = getattr(layer, "self_attn", None)
            missing += [f"layers[0].self_attn.{a}" for a in ATTENTION if attn is not None and not hasattr(attn, a)]
            module = sys.modules.get(type(attn).__module__) if attn is not None else None
            if module is not None and not hasattr(module, "apply_rotary_pos_emb"):
                missing.append(f"{module.__name__}.apply_rotary_pos_emb")
    if not hasattr(_lookup(base, "model"), "rope_deltas"):
        missing.append("model.rope_deltas")
    missing += [] if hasattr(DynamicCache(), "layers") else ["DynamicCache.layers"]
    missing += [f"DynamicLayer.{a}" for a in ("keys", "values") if not hasattr(DynamicLayer(), a)]
    return missing


def _lookup(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
    return obj


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def batch_bucket(n: int) -> int:
    """Batch sizes share graphs (a rollout's batch shrinks as episodes end): by power of two up to 64
    (at least 8), then by multiples of 64. Every bucket row is decoded and holds a cache row: a batch of
    192 (24 mazes x 8) in a power-of-two bucket decoded and cached 256 rows."""
    if n <= 64:
        return max(8, 1 << (n - 1).bit_length())
    return _round_up(n, 64)


@dataclass
class _Buffers:
    tokens: torch.Tensor     # [B, 1] the token each row feeds in
    positions: torch.Tensor  # [B] its M-RoPE position (equal in all three axes for text)
    slot: torch.Tensor       # [1] the cache index it is written to
    valid: torch.Tensor      # [B, L] which cache slots a row may attend to
    keys: list               # per layer [B, kv heads, L, head dim]
    values: list
    logits: torch.Tensor | None = None  # [B, vocab] the step's output
    graph: object = None


class GraphDecoder:
    def __init__(self, model, use_graphs: bool, max_graphs: int = 4, length_multiple: int = 256):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.model, self.base = model, base
        self.text = base.model.language_model
        self.lm_head = base.lm_head
        self.rope = sys.modules[type(self.text.layers[0].self_attn).__module__].apply_rotary_pos_emb
        # cache lengths share graphs in steps of 256 slots: prompts grow turn by turn, each capture costs
        # time (again after every sleep), and masked slots add little to a decode step
        self.use_graphs, self.max_graphs, self.length_multiple = use_graphs, max_graphs, length_multiple
        self.buffers: OrderedDict[tuple[int, int], _Buffers] = OrderedDict()
        self.pool = None
        self.captures, self.capture_s = 0, 0.0  # graphs captured so far, and the seconds it took
        self.prefilled_rows = 0  # distinct prompts prefilled so far

    def drop(self) -> None:
        """Forget every buffer and graph: the weights they point at moved (the engine slept)."""
        self.buffers.clear()
        self.pool = None

    # ---- one decode step over the buffers ---------------------------------------------------
    def _step(self, buf: _Buffers) -> torch.Tensor:
        batch = buf.tokens.shape[0]
        buf.valid.index_fill_(1, buf.slot, True)  # the new token sees itself
        x = self.text.embed_tokens(buf.tokens)
        cos, sin = self.text.rotary_emb(x, buf.positions.view(1, batch, 1).expand(3, batch, 1))
        mask = torch.zeros(buf.valid.shape, dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(~buf.valid, torch.finfo(x.dtype).min)[:, None, None, :]
        with sdpa_kernel(DECODE_ATTENTION, set_priority=True) if x.is_cuda else nullcontext():
            return self._layers(buf, x, mask, cos, sin)

    def _layers(self, buf: _Buffers, x, mask, cos, sin) -> torch.Tensor:
        batch = buf.tokens.shape[0]
        for i, layer in enumerate(self.text.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            shape = (batch, 1, -1, attn.head_dim)
            q = attn.q_norm(attn.q_proj(h).view(shape)).transpose(1, 2)
            k = attn.k_norm(attn.k_proj(h).view(shape)).transpose(1, 2)
            v = attn.v_proj(h).view(shape).transpose(1, 2)
            q, k = self.rope(q, k, cos, sin)
            buf.keys[i].index_copy_(2, buf.slot, k)
            buf.values[i].index_copy_(2, buf.slot, v)
            o = F.scaled_dot_product_attention(q, buf.keys[i], buf.values[i], attn_mask=mask, scale=attn.scaling,
                                               enable_gqa=True)
            x = x + attn.o_proj(o.transpose(1, 2).reshape(batch, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        buf.slot.add_(1)
        buf.positions.add_(1)
        return self.lm_head(self.text.norm(x))[:, -1]

    def _buffers_for(self, batch: int, length: int, like: torch.Tensor) -> _Buffers:
        key = (batch_bucket(batch), _round_up(length, self.length_multiple))
        if key in self.buffers:
            self.buffers.move_to_end(key)
            return self.buffers[key]
        while len(self.buffers) >= self.max_graphs:
            self.buffers.popitem(last=False)
        rows, slots = key
        device, dtype = like.device, like.dtype
        cfg = self.text.config
        kv_shape = (rows, cfg.num_key_value_heads, slots, self.text.layers[0].self_attn.head_dim)
        buf = _Buffers(tokens=torch.zeros(rows, 1, dtype=torch.long, device=device),
                       positions=torch.zeros(rows, dtype=torch.long, device=device),
                       slot=torch.zeros(1, dtype=torch.long, device=device),
                       valid=torch.zeros(rows, slots, dtype=torch.bool, device=device),
                       keys=[torch.zeros(kv_shape, dtype=dtype, device=device) for _ in self.text.layers],
                       values=[torch.zeros(kv_shape, dtype=dtype, device=device) for _ in self.text.layers])
        if self.use_graphs:
            start = time.perf_counter()
            # warm up on a side stream (lazy inits, kernel selection), then capture; what the warm-up
            # writes into the buffers is overwritten before every real use
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self._step(buf)
            torch.cuda.current_stream().wait_stream(stream)
            self.pool = self.pool or torch.cuda.graph_pool_handle()
            buf.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(buf.graph, pool=self.pool):
                buf.logits = self._step(buf)
            torch.cuda.synchronize()
            self.captures += 1
            self.capture_s += time.perf_counter() - start
        self.buffers[key] = buf
        return buf

    def _run_step(self, buf: _Buffers) -> torch.Tensor:
        if buf.graph is None:
            return self._step(buf)
        buf.graph.replay()
        return buf.logits

    # ---- prefill, then decode ---------------------------------------------------------------
    def _prefill(self, ids, mask, extra) -> tuple[torch.Tensor, list, list, torch.Tensor]:
        """The model's own forward over the prompts: last-position logits, per-layer keys and values,
        and each row's M-RoPE position offset (the model computes it from the pictures' grids)."""
        self.base.model.rope_deltas = None  # never reuse a previous batch's offsets
        out = self.model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **extra)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        deltas = self.base.model.rope_deltas.view(-1).to(ids.device)
        return out.logits[:, -1], [k for k, _ in layers], [v for _, v in layers], deltas

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, mask: torch.Tensor, extra: dict, max_new_tokens: int, temperature: float,
                 suppress: list[int], end_id: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Distinct left-padded prompts in, and `rows`: the prompt each sequence continues (a prompt
        is prefilled once, however many sequences sample from it). Out: ([sequences, new tokens]
        token ids, their log-probs), log-probs of the temperature-scaled distribution (temperature
        0: greedy, log-probs at 1)."""
        width, batch = ids.shape[1], len(rows)
        logits, keys, values, deltas = self._prefill(ids, mask, extra)
        self.prefilled_rows += ids.shape[0]
        logits, mask, deltas = logits[rows], mask[rows], deltas[rows]
        buf = self._buffers_for(batch, width + max_new_tokens, keys[0])
        for layer, (k, v) in enumerate(zip(keys, values)):
            buf.keys[layer][:batch, :, :width] = k[rows]
            buf.values[layer][:batch, :, :width] = v[rows]
        buf.valid.zero_()
        buf.valid[:batch, :width] = mask.bool()
        buf.valid[batch:] = True  # rows that only fill the bucket: anything finite
        buf.positions.zero_()
        buf.positions[:batch] = mask.sum(-1) + deltas  # the first new token's position
        buf.slot.fill_(width)
        greedy = temperature <= 0
        suppress_ids = torch.tensor(suppress, dtype=torch.long, device=ids.device)
        tokens, logps = [], []
        ended = torch.zeros(batch, dtype=torch.bool, device=ids.device)
        for t in range(max_new_tokens):
            scaled = logits[:batch].float() / (1.0 if greedy else temperature)
            allowed = scaled.index_fill(-1, suppress_ids, float("-inf"))
            token = allowed.argmax(-1) if greedy else torch.multinomial(allowed.softmax(-1), 1).squeeze(-1)
            logps.append(torch.log_softmax(scaled, -1).gather(-1, token[:, None]).squeeze(-1))
            tokens.append(token)
            ended |= token == end_id
            if t + 1 == max_new_tokens or (t % 8 == 7 and bool(ended.all())):
                break
            buf.tokens[:batch, 0] = token
            logits = self._run_step(buf)
        return torch.stack(tokens, 1), torch.stack(logps, 1)
