"""The typed configuration. Key names follow SkyRL's, so its command lines work verbatim.

Every field has a default; `configs/default.yaml` is the embedded CPU run and
`configs/hyperpod_qwen3vl_8b.yaml` the reference run on 3 nodes x 2 GPUs. Keys that SkyRL does
not have (ours) are marked "visrl:" in their comment.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class LoraConfig:
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str = "all-linear"  # or a comma-separated list of module names


@dataclass
class ModelConfig:
    path: str = "assets/maze-vl-base"  # local folder, s3://bucket/prefix or a Hugging Face id
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class OptimizerConfig:
    lr: float = 1e-4
    adam_betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    num_warmup_steps: int = 0
    scheduler: str = "constant_with_warmup"  # constant_with_warmup | cosine_with_warmup


@dataclass
class FsdpConfig:
    cpu_offload: bool = False


@dataclass
class PolicyConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer_config: OptimizerConfig = field(default_factory=OptimizerConfig)
    fsdp_config: FsdpConfig = field(default_factory=FsdpConfig)


@dataclass
class RefConfig:
    fsdp_config: FsdpConfig = field(default_factory=FsdpConfig)


@dataclass
class AlgorithmConfig:
    advantage_estimator: str = "grpo"  # grpo | rloo
    grpo_norm_by_std: bool = True
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_estimator_type: str = "k3"  # k1 | k2 | k3
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    loss_reduction: str = "token_mean"  # token_mean | sequence_mean
    entropy_coef: float = 0.0
    filter_zero_advantage_groups: bool = False  # visrl: drop all-equal groups from the update
    use_rollout_logprobs: bool = False  # visrl: the engines' sampling log-probs as the old policy


@dataclass
class PlacementConfig:
    colocate_all: bool = True
    policy_num_nodes: int = 1
    policy_num_gpus_per_node: int = 1
    ref_num_nodes: int = 1
    ref_num_gpus_per_node: int = 1
    cpus_per_bundle: float = 1.0  # visrl: CPUs in each per-device bundle
    timeout_s: float = 120.0  # visrl: give up on an unsatisfiable placement group after this


@dataclass
class TrainerConfig:
    epochs: int = 20
    train_batch_size: int = 8  # prompts per step
    policy_mini_batch_size: int = 8  # prompts per optimizer step
    micro_forward_batch_size_per_gpu: int = 16
    micro_train_batch_size_per_gpu: int = 16
    update_epochs_per_batch: int = 1
    max_prompt_length: int = 2048
    strategy: str = "fsdp2"  # fsdp | fsdp2 (both run FSDP2's fully_shard)
    seed: int = 42
    device: str = "auto"  # visrl: auto | cpu | cuda
    eval_interval: int = 5
    eval_before_train: bool = True
    ckpt_interval: int = 10
    hf_save_interval: int = 10
    resume_mode: str = "latest"  # none | latest | from_path
    resume_path: Optional[str] = None
    ckpt_path: str = "runs/default/ckpts"
    export_path: str = "runs/default/exports"
    max_ckpts_to_keep: int = -1
    max_restarts: int = 2  # visrl: actor-group rebuilds before the run gives up
    fail_on_ckpt_error: bool = False  # visrl: stop the run when a checkpoint cannot be saved
    stop_after_step: int = 0  # visrl: end this invocation after that step (0 = run to the end); resume later
    run_dir: str = "runs/default"  # visrl: metrics.jsonl, TensorBoard events, curve, config
    project_name: str = "visrl"
    run_name: str = "default"
    logger: str = "tensorboard"
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)


@dataclass
class SamplingParams:
    max_generate_length: int = 16
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class EvalSamplingParams:
    max_generate_length: int = 16
    temperature: float = 0.0  # greedy


@dataclass
class InferenceEngineConfig:
    backend: str = "hf"  # hf | vllm
    num_engines: int = 1
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.45
    enable_sleep: bool = True  # visrl: engines free memory while shards train (colocate_all)
    engine_init_kwargs: Dict[str, Any] = field(default_factory=dict)


@dataclass
class GeneratorConfig:
    inference_engine: InferenceEngineConfig = field(default_factory=InferenceEngineConfig)
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    eval_sampling_params: EvalSamplingParams = field(default_factory=EvalSamplingParams)
    max_turns: int = 15
    max_input_length: int = 8192
    n_samples_per_prompt: int = 8
    context_window_turns: int = 0  # visrl: keep only the last K turns (text and picture); 0 = all
    context_pictures: int = 0  # visrl: of the kept turns, only the last P keep their picture; 0 = all


@dataclass
class EnvironmentConfig:
    env_class: str = "maze_2d/easy"  # maze_2d/easy | maze_2d/hard
    cell_px: int = 16


@dataclass
class DataConfig:
    dataset_dir: str = "runs/default/data"  # visrl: train.jsonl, eval.jsonl, manifest.json
    train_size: int = 256
    eval_size: int = 64
    train_seed_start: int = 0
    eval_seed_start: int = 1_000_000
    solvable_only: bool = True  # keep only mazes the expert solves within generator.max_turns
    eval_set: Optional[str] = None  # visrl: another eval set (a .jsonl from --make-dataset)


@dataclass
class RayConfig:
    address: Optional[str] = None  # None starts a local cluster; "auto" joins a running one
    namespace: str = "visrl"
    include_dashboard: bool = False


@dataclass
class S3Config:
    endpoint_url: Optional[str] = None  # visrl: for S3-compatible stores (MinIO, moto)
    region: Optional[str] = None
    max_attempts: int = 5
    timeout_s: float = 60.0  # visrl: connect/read timeout of one S3 request


@dataclass
class Config:
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    data: DataConfig = field(default_factory=DataConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    s3: S3Config = field(default_factory=S3Config)


# Keys with a closed set of values: checked with a message that lists them.
CHOICES: dict[str, tuple[Any, ...]] = {
    "trainer.strategy": ("fsdp", "fsdp2"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.resume_mode": ("none", "latest", "from_path"),
    "trainer.logger": ("tensorboard", "console"),
    "trainer.algorithm.advantage_estimator": ("grpo", "rloo"),
    "trainer.algorithm.kl_estimator_type": ("k1", "k2", "k3"),
    "trainer.algorithm.loss_reduction": ("token_mean", "sequence_mean"),
    "trainer.policy.optimizer_config.scheduler": ("constant_with_warmup", "cosine_with_warmup"),
    "generator.inference_engine.backend": ("hf", "vllm"),
    "environment.env_class": ("maze_2d/easy", "maze_2d/hard"),
}
