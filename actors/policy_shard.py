"""FSDPPolicyShard: one FSDP2 shard of the frozen base plus its trainable LoRA.

Methods: logprobs(items) for the behaviour policy, reference_logprobs(items) for the KL term's
reference (the frozen base, adapter off; `trainer.ref.from_policy_base`), train(items) for one GRPO batch (mini-batches
of prompts, micro-batches with gradient accumulation, `update_epochs_per_batch` passes, AdamW on
the LoRA weights only, grad-norm clipping, an LR schedule with warmup over training steps),
save_adapter(folder) writing the full LoRA from rank 0 in PEFT format, and
state_dict()/load_state_dict() with everything gathered (LoRA and optimizer states are small), so
a checkpoint loads at any world size.
"""
from __future__ import annotations

import functools
import json
import math
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from inference.host_copy import pinned_copies
from inference.pictures import PicturePreprocessor
from rl.algorithm import entropy, policy_loss
from settings.schema import AlgorithmConfig
from storage.atomic import replace_dir, temp_beside
from telemetry.collectives import CollectiveRecorder
from vlm.forward import agree_max, collate, cut_micro_batches, micro_batch_order, sampled_logprobs, score_seqs
from vlm.load import release_cached_memory
from vlm.sharding import group_names, init_distributed, shard_model, staging_device


def resident(method):
    """The weights back on the device first, if offload() sent them to host memory."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        self.reload()
        return method(self, *args, **kwargs)
    return run


class FSDPPolicyShard:
    def __init__(self, model_path: str, rank: int = 0, world_size: int = 1, device: str = "cpu",
                 lora: dict | None = None, optimizer: dict | None = None, total_steps: int = 1,
                 seed: int = 42, cpu_offload: bool = False, s3_cfg=None, threads: int | None = None,
                 dtype: str = "float32", gradient_checkpointing: bool = False, speedups: bool = True,
                 fsdp_size: int = -1, record_collectives: bool = False, compile_layers: bool = False,
                 max_tokens_per_micro_batch: int = 0):
        self.model_path, self.rank, self.world_size, self.device = model_path, rank, world_size, device
        self.fsdp_size, self.record_collectives = fsdp_size, record_collectives
        self.recorder = None  # a CollectiveRecorder once set up, with record_collectives
        self.lora_cfg = {"rank": 16, "alpha": 32, "dropout": 0.0, "target_modules": "all-linear", **(lora or {})}
        self.optim_cfg = {"lr": 1e-4, "adam_betas": [0.9, 0.999], "weight_decay": 0.0, "max_grad_norm": 1.0,
                          "num_warmup_steps": 0, "scheduler": "constant_with_warmup", **(optimizer or {})}
        self.total_steps, self.seed, self.cpu_offload, self.s3_cfg = total_steps, seed, cpu_offload, s3_cfg
        self.gradient_checkpointing, self.speedups, self.compile_layers = gradient_checkpointing, speedups, compile_layers
        self.max_tokens = max_tokens_per_micro_batch  # 0: micro-batches by count alone
        # with bf16 (GPUs) the frozen base is held in bf16 and only the LoRA weights keep fp32 masters
        # (PEFT creates them in fp32); FSDP2 computes in bf16 and reduces gradients in fp32
        self.bf16_compute = dtype == "bfloat16"
        self.dtype = torch.bfloat16 if self.bf16_compute else torch.float32
        if threads:
            torch.set_num_threads(threads)
        self.model = None
        self.offloaded = False  # the weights in host memory while colocated engines generate (offload)
        self.host_base = None   # {frozen parameter: its page-locked host copy}, one device's model only

    # ---- set-up -------------------------------------------------------------------------------
    def address(self) -> tuple[str, int]:
        from net import free_port, node_ip
        return node_ip(), free_port("")

    def setup(self, master_addr: str = "127.0.0.1", master_port: int = 29500) -> int:
        """Join the process group, load and shard the model, build optimizer and schedule."""
        from peft import get_peft_model

        from vlm.compiled_layers import compile_decoder_layers
        from vlm.load import load_model
        from vlm.lora_addmm import fuse_lora_updates

        init_distributed(self.rank, self.world_size, master_addr, master_port, self.device)
        torch.manual_seed(self.seed)
        base, self.processor = load_model(self.model_path, staging_device(self.device, self.cpu_offload), self.dtype,
                                         self.s3_cfg, speedups=self.speedups)
        for p in base.parameters():
            p.requires_grad_(False)
        if self.gradient_checkpointing:  # only while training: the no-grad scoring passes keep nothing
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.model = get_peft_model(base, lora_config(self.lora_cfg))
        if self.speedups:
            fuse_lora_updates(self.model)
        self.model.train()
        mesh = shard_model(self.model, self.device, self.world_size, self.cpu_offload, bf16_compute=self.bf16_compute,
                           fsdp_size=self.fsdp_size)
        if self.compile_layers:
            compile_decoder_layers(self.model)
        self.recorder = CollectiveRecorder(group_names(mesh), self.device) if self.record_collectives else None
        # a step's passes (reference, old policy, each update epoch) show the same pictures
        self.pictures = PicturePreprocessor(self.processor.image_processor, self.dtype)
        params = [p for p in self.model.parameters() if p.requires_grad]
        o = self.optim_cfg
        self.optimizer = torch.optim.AdamW(params, lr=o["lr"], betas=tuple(o["adam_betas"]),
                                           weight_decay=o["weight_decay"])
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_schedule(self.optim_cfg, self.total_steps))
        self.optimizer_steps = 0
        return sum(p.numel() for p in params)

    # ---- taking turns with colocated engines ----------------------------------------------------
    def offload(self) -> float:
        """Free this GPU for the engines that share it while they generate (colocate_all, as SkyRL
        does): the model's weights, the frozen base's and the LoRA's, move to host memory; the first
        call that needs them brings them back (reload). The optimizer's state stays (LoRA's alone:
        small). Returns the GiB moved; nothing moves on the CPU or with cpu_offload (there already)."""
        if not self.device.startswith("cuda") or self.cpu_offload or self.offloaded:
            return 0.0
        moved = sum(p.numel() * p.element_size() for p in self.model.parameters()) / 2**30
        with torch.no_grad():
            if isinstance(self.model, FSDPModule):
                self.model.to("cpu")  # FSDP2 re-points its shards (FSDPModule._apply)
            else:
                self._weights_to_host()
        self.offloaded = True
        release_cached_memory(self.device)
        return moved

    def _weights_to_host(self) -> None:
        """One device's model (not wrapped in FSDP): the frozen base never changes, so one page-locked
        host copy, made at the first offload, serves every later one (nothing is copied back, and the
        reload reads pinned memory), as the hf engine keeps its own while it sleeps; the LoRA weights move."""
        if self.host_base is None:
            self.host_base = pinned_copies(p for p in self.model.parameters() if not p.requires_grad)
        for p in self.model.parameters():
            p.data = self.host_base[p] if p in self.host_base else p.data.to("cpu")

    def reload(self) -> None:
        if not self.offloaded:
            return
        with torch.no_grad():
            if isinstance(self.model, FSDPModule):
                self.model.to(self.device)
            else:
                for p in self.model.parameters():
                    p.data = p.data.to(self.device, non_blocking=True)
                torch.cuda.synchronize()
        self.offloaded = False

    # ---- forward passes -----------------------------------------------------------------------
    @resident
    def logprobs(self, items: list, temperature: float = 1.0, micro_batch: int = 16) -> dict[int, np.ndarray]:
        """{item key: log-probs of its sampled tokens} under the current policy."""
        self.model.eval()
        try:
            with self._recording():
                scored = score_seqs(self.model, self.processor, [it.seq for it in items], micro_batch, self.device,
                                    self.dtype, temperature, self.world_size, self.pictures, self.max_tokens)
        finally:
            self.model.train()
        return {it.key: lp for it, lp in zip(items, scored)}

    def _recording(self):
        """Collectives counted from here (record_collectives), reported with the step's train metrics."""
        return self.recorder if self.recorder is not None else nullcontext()

    def reference_logprobs(self, items: list, temperature: float = 1.0, micro_batch: int = 16) -> dict[int, np.ndarray]:
        """{item key: log-probs of its sampled tokens} under the frozen base, the adapter switched
        off: the reference model, without a RefShard holding another copy of it."""
        with adapter_off(self.model):
            scored = self.logprobs(items, temperature, micro_batch)
        release_cached_memory(self.device)
        return scored

    @resident
    def train(self, items: list, algo: AlgorithmConfig, temperature: float = 1.0, micro_batch: int = 16,
              epochs: int = 1, *ref_logprobs: dict) -> dict:
        """One GRPO batch on this rank's rl.batch.TrainItem share (token weights already global).

        ref_logprobs: the reference shards' {item key: log-probs}, as many dicts as there are ref
        shards (Ray resolves them here, straight from the object store). The old policy is the
        engines' sampling log-probs with use_rollout_logprobs, else this policy before the update.
        With record_collectives the metrics carry comm/*: this call's collectives and the scoring
        passes' since the last train (telemetry/collectives.py)."""
        with self._recording():
            out = self._train(items, algo, temperature, micro_batch, epochs, ref_logprobs)
        return out if self.recorder is None else out | self.recorder.take()

    def _train(self, items: list, algo: AlgorithmConfig, temperature: float, micro_batch: int, epochs: int,
               ref_logprobs: tuple) -> dict:
        ref = {k: v for part in ref_logprobs for k, v in part.items()} or None
        rollout = {it.key: it.seq.rollout_logprobs() for it in items}
        minibatches = sorted({it.minibatch for it in items})
        n_mb = self._agree_max(len(minibatches))
        # the engine-vs-trainer gap (bf16 kernels differ): over every token where the old policy is
        # recomputed, else over the first mini-batch, whose passes all run before the first update
        gap = dict.fromkeys(("abs_diff", "k3", "tokens"), 0.0)
        if algo.use_rollout_logprobs:
            old = rollout
        else:
            # The first mini-batch's training forward runs before any update, so its log-probs are
            # the old policy's: only later mini-batches need a pass of their own, made now.
            later = [it for it in items if it.minibatch != minibatches[0]]
            old = {}
            if n_mb > 1:  # every rank joins the pass; one with nothing later scores a throwaway item
                scored = self.logprobs(later or items[:1], temperature, micro_batch)
                old = {it.key: scored[it.key] for it in later}
            for it in later:
                add_gap(gap, old[it.key], rollout[it.key])
        sums = dict.fromkeys(("policy_loss", "policy_kl", "entropy", "clipped", "tokens", "approx_kl", "tis_weight"), 0.0)
        grad_norms = []
        for _ in range(epochs):
            for m in range(n_mb):
                mine = [it for it in items if m < len(minibatches) and it.minibatch == minibatches[m]]
                mine = [mine[i] for i in micro_batch_order([it.seq for it in mine])]
                micro = [mine[cut] for cut in cut_micro_batches([len(it.seq.input_ids) for it in mine], micro_batch,
                                                                self.max_tokens)]
                n_micro = self._agree_max(len(micro))
                self.optimizer.zero_grad(set_to_none=True)
                for k in range(n_micro):
                    # ranks must run the same number of passes: a rank with no data left runs a
                    # pass that contributes nothing (scale 0)
                    chunk, scale = (micro[k], 1.0) if k < len(micro) else (items[:1], 0.0)
                    # gradients cross between ranks once a mini-batch, after its last micro-batch: the
                    # ones before accumulate where they are (LoRA's alone: the base has none)
                    if isinstance(self.model, FSDPModule):
                        self.model.set_requires_gradient_sync(k == n_micro - 1)
                    for key, v in self._micro_step(chunk, scale, algo, temperature, old, ref, rollout,
                                                   gap if not grad_norms else None).items():
                        sums[key] += v
                params = [p for p in self.model.parameters() if p.requires_grad]
                norm = torch.nn.utils.clip_grad_norm_(params, self.optim_cfg["max_grad_norm"])
                grad_norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
                self.optimizer.step()
                self.optimizer_steps += 1
        # the schedule runs over training steps (total_steps of them), not optimizer steps, whose
        # number per batch varies with how many groups carry signal; a step with no signal at all
        # never calls train, so it does not advance the schedule
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        release_cached_memory(self.device)
        sums = self._sum_across_ranks(sums)
        gap = self._sum_across_ranks(gap)
        steps = max(len(grad_norms), 1)
        out = {"policy_loss": sums["policy_loss"] / steps, "policy_kl": sums["policy_kl"] / steps,
               "entropy": sums["entropy"] / steps, "clip_ratio": sums["clipped"] / max(sums["tokens"], 1),
               "approx_kl": sums["approx_kl"] / max(sums["tokens"], 1),
               "grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0,
               "lr": lr, "optimizer_steps": len(grad_norms),
               "rollout_logprob_diff": gap["abs_diff"] / max(gap["tokens"], 1),
               "rollout_k3": gap["k3"] / max(gap["tokens"], 1)}
        if algo.use_tis:
            out["tis_weight"] = sums["tis_weight"] / max(sums["tokens"], 1)
        return out

    def _micro_step(self, chunk, scale: float, algo: AlgorithmConfig, temperature: float, old: dict,
                    ref: dict | None, rollout: dict, gap: dict | None) -> dict:
        batch = collate([it.seq for it in chunk], self.processor, self.device, self.dtype, self.pictures)
        logp, logp_all = sampled_logprobs(self.model, batch, temperature, with_distribution=True)
        dev = logp.device
        first_pass = scale and any(it.key not in old for it in chunk)
        if first_pass or (gap is not None and scale):
            host_logp = logp.detach().float().cpu().numpy()  # one host copy for both uses
        if first_pass:
            # an item's first pass before any update: this forward is the old policy (and later
            # epochs reuse what it gave)
            for it, piece in zip(chunk, np.split(host_logp, np.cumsum([it.n_scored for it in chunk])[:-1])):
                old.setdefault(it.key, piece)
        if gap is not None and scale:
            add_gap(gap, host_logp, np.concatenate([rollout[it.key] for it in chunk]))

        def per_token(values):
            return torch.tensor(np.concatenate([np.full(it.n_scored, v, dtype=np.float32)
                                                for it, v in zip(chunk, values)]), device=dev)

        def flat(table):
            # NaN marks a token no engine sampled (an exploratory action, rl/rollout.py): this pass's
            # own log-prob stands in, so its ratio is 1 and it trains as if sampled
            values = torch.tensor(np.concatenate([table[it.key] for it in chunk]), device=dev)
            return torch.where(torch.isnan(values), logp.detach().to(values.dtype), values)

        weights = per_token([it.token_weight for it in chunk]) * scale  # global: sums to 1 per mini-batch
        advantages = torch.tensor(np.concatenate([it.advantage for it in chunk]), device=dev)
        loss, stats = policy_loss(algo, logp, flat(old), advantages, weights,
                                  ref_logp=flat(ref) if ref is not None else None, token_entropy=entropy(logp_all),
                                  rollout_logp=flat(rollout) if algo.use_tis else None)
        # FSDP averages gradients over ranks; the weights are global, so scale the average back up
        (loss * self.world_size).backward()
        return stats

    def _agree_max(self, n: int) -> int:
        return agree_max(n, self.world_size, self.device)

    def _sum_across_ranks(self, stats: dict) -> dict:
        if self.world_size == 1:
            return stats
        keys = sorted(stats)
        t = torch.tensor([stats[k] for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return dict(zip(keys, t.tolist()))

    # ---- weights out and in -------------------------------------------------------------------
    def _full_lora(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
        return get_model_state_dict(self.model, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True, ignore_frozen_params=True))

    @resident
    def save_adapter(self, folder: str) -> str | None:
        """Write the full adapter (PEFT layout) to `folder` atomically; rank 0 writes, all gather."""
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        full = self._full_lora()
        if self.rank != 0:
            return None
        folder = Path(folder)
        tmp = temp_beside(folder)
        tmp.mkdir(parents=True)
        tensors = get_peft_model_state_dict(self.model, state_dict=full)
        if not tensors or any(t.numel() == 0 for t in tensors.values()):
            raise RuntimeError("gathered LoRA state is empty; refusing to write an empty adapter")
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "adapter_model.safetensors"))
        config = self.model.peft_config["default"].to_dict()
        config["base_model_name_or_path"] = self.model_path
        config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
        (tmp / "adapter_config.json").write_text(json.dumps(config, indent=2, default=str))
        replace_dir(tmp, folder)
        return str(folder)

    @resident
    def state_dict(self) -> dict | None:
        """Optimizer (gathered to full tensors) and scheduler state; rank 0 returns it. The LoRA
        weights travel as the adapter (save_adapter), so a checkpoint holds them once."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
        optim_sd = get_optimizer_state_dict(self.model, self.optimizer, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        return {"optimizer": optim_sd, "scheduler": self.scheduler.state_dict(),
                "optimizer_steps": self.optimizer_steps, "torch_rng": torch.get_rng_state()}

    @resident
    def load_state_dict(self, state: dict) -> None:
        """Restore from {"lora": PEFT adapter tensors, "optimizer", "scheduler", ...} at any world size."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict
        set_state_dict(self.model, self.optimizer, model_state_dict=self._lora_state(state["lora"], "checkpoint"),
                       optim_state_dict=state["optimizer"], options=StateDictOptions(full_state_dict=True, strict=False))
        self.scheduler.load_state_dict(state["scheduler"])
        self.optimizer_steps = int(state["optimizer_steps"])
        torch.set_rng_state(state["torch_rng"])

    @resident
    def load_adapter_weights(self, lora: dict) -> None:
        """Start from another run's adapter (PEFT tensors): its weights, this run's fresh optimizer."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        set_model_state_dict(self.model, self._lora_state(lora, "initial"),
                             options=StateDictOptions(full_state_dict=True, strict=False))

    def _lora_state(self, lora: dict, what: str) -> dict:
        """{parameter name: tensor} for this model's LoRA weights from PEFT's keys, all of them present
        and no others (an adapter of other target modules or rank is refused, not half loaded)."""
        names = [n for n, p in self.model.named_parameters() if p.requires_grad]
        missing = [n for n in names if _peft_key(n) not in lora]
        if missing:
            raise ValueError(f"{what} adapter lacks {len(missing)} LoRA tensors of this model, e.g. "
                             f"{_peft_key(missing[0])}; was it saved with another lora config?")
        extra = set(lora) - {_peft_key(n) for n in names}
        if extra:
            raise ValueError(f"{what} adapter holds {len(extra)} LoRA tensors this model's LoRA lacks, e.g. "
                             f"{min(extra)}; was it saved with other target_modules?")
        return {n: lora[_peft_key(n)] for n in names}

    def peak_memory_gib(self) -> float:
        from vlm.load import peak_memory_gib
        return peak_memory_gib()

    def shutdown(self) -> None:
        if dist.is_initialized():
            # A rank that tears gloo down while another is still in a collective aborts the process:
            # all ranks arrive first. (gloo's threads still outlive this, held by DTensor's caches
            # until interpreter teardown: tests/fsdp_worker.py, rank_process.)
            dist.barrier()
            dist.destroy_process_group()


@contextmanager
def adapter_off(model):
    """The frozen base's forward: every LoRA layer skips its adapter. PEFT's own disable_adapter()
    also clears the adapter weights' requires_grad, from which FSDP2 takes the dtype it reduces
    gradients in: a first forward under it left bf16 gradients for the fp32 LoRA weights."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer in layers:
            layer._disable_adapters = False


def add_gap(gap: dict, trainer_logp: np.ndarray, engine_logp: np.ndarray) -> None:
    """Add one sequence's (or chunk's) engine-vs-trainer log-prob gap to the running sums."""
    sampled = ~np.isnan(engine_logp)  # exploratory actions have no engine log-prob
    d = trainer_logp[sampled].astype(np.float64) - engine_logp[sampled]
    gap["abs_diff"] += float(np.abs(d).sum())
    gap["k3"] += float((np.exp(d) - d - 1).sum())
    gap["tokens"] += float(d.size)


def lora_config(lora: dict):
    """PEFT's LoraConfig from `trainer.policy.model.lora` (target_modules: "all-linear" or "a,b,c")."""
    from peft import LoraConfig
    target = lora["target_modules"]
    return LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=lora["dropout"],
                      target_modules=target if target == "all-linear" else [t.strip() for t in target.split(",")])


def lr_schedule(optim_cfg: dict, total_steps: int):
    """LR factor by optimizer step: linear warmup, then constant or cosine. A plain closure, not a
    bound method: LambdaLR saves a method's __dict__, which Ray fills with non-tensor objects that
    weights_only loading rightly refuses."""
    warm, cosine = optim_cfg["num_warmup_steps"], optim_cfg["scheduler"] == "cosine_with_warmup"

    def factor(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if cosine:
            progress = min(1.0, (step - warm) / max(1, total_steps - warm))
            return 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0
    return factor


def _peft_key(name: str) -> str:
    """The key PEFT writes for a parameter (adapter name dropped): lora_A.default.weight -> lora_A.weight."""
    return name.replace(".default.", ".")
