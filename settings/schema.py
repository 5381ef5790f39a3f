"""The typed configuration. Key names follow SkyRL's, so its command lines work verbatim.

Every field has a default; `configs/default.yaml` is the embedded CPU run and
`configs/hyperpod_qwen3vl_8b.yaml` the reference run on 3 nodes x 2 GPUs. Keys that SkyRL does
not have (ours) are marked "visrl:" in their comment.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from rl.algorithm import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_REDUCTIONS, POLICY_LOSSES, AlgorithmConfig


@dataclass
class LoraConfig:
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: str = "all-linear"  # or a comma-separated list of module names
    # visrl: a PEFT adapter (folder or s3:// prefix, e.g. an earlier run's exports/global_step_N/policy)
    # the run's adapter starts from, with a fresh optimizer: a curriculum's next stage. Same rank,
    # alpha and target modules; a checkpoint to resume from takes precedence.
    init_from: Optional[str] = None


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
    # visrl: the reference is the policy's frozen base (LoRA trains on top of it), so the policy
    # shards score it with the adapter switched off and no RefShard is placed; false places SkyRL's
    # separate RefShards (the same numbers, one more copy of the base on each device)
    from_policy_base: bool = True


@dataclass
class PlacementConfig:
    colocate_all: bool = True
    policy_num_nodes: int = 1
    policy_num_gpus_per_node: int = 1
    ref_num_nodes: int = 1
    ref_num_gpus_per_node: int = 1
    cpus_per_bundle: float = 1.0  # visrl: CPUs in each per-device bundle
    # visrl: a custom resource each per-device bundle also asks one of: picks a node type, or stands in
    # for GPUs on CPU nodes (deploy/local_cluster.py gives its workers `visrl_device` slots)
    device_resource: Optional[str] = None
    timeout_s: float = 120.0  # visrl: give up on an unsatisfiable placement group after this, at start
    # visrl: after a lost node, how long recovery waits for the cluster to place the groups again (a
    # platform replacing a node takes minutes)
    recovery_timeout_s: float = 1200.0


@dataclass
class TrainerConfig:
    epochs: int = 20
    train_batch_size: int = 8  # prompts per step
    policy_mini_batch_size: int = 8  # prompts per optimizer step
    micro_forward_batch_size_per_gpu: int = 16
    micro_train_batch_size_per_gpu: int = 16
    update_epochs_per_batch: int = 1
    # recompute each block's activations in the backward pass instead of holding them: far less
    # memory for a little more compute, so micro-batches can grow (SkyRL's key; non-reentrant only)
    gradient_checkpointing: bool = False
    gradient_checkpointing_use_reentrant: bool = False
    max_prompt_length: int = 2048  # the first turn's prompt (instruction + picture) must fit
    eval_batch_size: int = 0  # eval mazes run at once; 0 = all of them
    strategy: str = "fsdp2"  # fsdp | fsdp2 (both run FSDP2's fully_shard; FSDP1 is not supported)
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
    # visrl: the serving prefix `driver.py --publish NAME` writes <publish_path>/NAME/ under: what the serve
    # app's (and ray.serve.llm's) dynamic_lora_loading_path reads
    publish_path: Optional[str] = None
    max_ckpts_to_keep: int = -1
    max_restarts: int = 10  # visrl: actor-group rebuilds (each a lost actor or node) before the run gives up
    fail_on_ckpt_error: bool = False  # visrl: stop the run when a checkpoint cannot be saved
    ckpt_timeout_s: float = 120.0  # visrl: longest a checkpoint save may hold up a step
    stop_after_step: int = 0  # visrl: end this invocation after that step (0 = run to the end); resume later
    run_dir: str = "runs/default"  # visrl: metrics.jsonl, TensorBoard events, curve, config
    project_name: str = "visrl"  # labels the progress bar
    run_name: str = "default"
    logger: str = "tensorboard"  # tensorboard | console | mlflow | wandb (metrics.jsonl and the console always)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)

    def ref_source(self) -> str:
        """Who scores the KL term's reference: "none" without a KL loss, "policy" for the policy
        shards' frozen base with the adapter off (`ref.from_policy_base`), else "shards" (RefShards)."""
        if not self.algorithm.use_kl_loss:
            return "none"
        return "policy" if self.ref.from_policy_base else "shards"


@dataclass
class SamplingParams:
    max_generate_length: int = 16
    temperature: float = 1.0
    top_p: float = 1.0


@dataclass
class EvalSamplingParams:
    max_generate_length: int = 16
    temperature: float = 0.0  # 0 = greedy


@dataclass
class InferenceEngineConfig:
    backend: str = "hf"  # hf | vllm
    num_engines: int = 1
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.45
    enable_sleep: bool = True  # visrl: engines free memory while shards train (colocate_all)
    cpu_kv_cache_gib: float = 2.0  # visrl: vLLM's KV cache on a CPU machine (VLLM_CPU_KVCACHE_SPACE)
    # visrl: the hf backend on a GPU merges each adapter version into its bf16 weights (faster decode,
    # but the rounding widens the engine-vs-trainer gap ~10x: docs/configuration.md)
    merge_lora: bool = False
    # visrl: the hf backend on a GPU decodes in its own loop, each step replayed as a CUDA graph
    # (false: transformers' generate); vLLM's own graphs: engine_init_kwargs.enforce_eager
    cuda_graphs: bool = True
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
    env_class: str = "maze_2d/easy"  # a registered environment (envs/registry.py) or package.module:Class
    cell_px: int = 16


@dataclass
class DataConfig:
    dataset_dir: str = "runs/default/data"  # visrl: train.jsonl, eval.jsonl, manifest.json
    train_size: int = 256
    eval_size: int = 64
    train_seed_start: int = 0
    eval_seed_start: int = 1_000_000
    solvable_only: bool = True  # keep only mazes the expert solves within generator.max_turns
    long_route_share: Optional[float] = None  # visrl: share of train mazes with a route longer than the shortest
    junction_start_share: float = 0.0  # visrl: share of train mazes that start at a junction of their route
    replay_share: float = 0.0  # visrl: up to this share of a batch replays mazes whose group came back mixed
    long_route_repeats: int = 1  # visrl: a train maze whose route is longer than its env's shortest is drawn this often an epoch
    eval_set: Optional[str] = None  # visrl: another eval set (a .jsonl from --make-dataset)
    validation_size: int = 0  # visrl: mazes that choose the best adapter at each eval (0: none, the final one is the run's)
    validation_seed_start: int = 2_000_000  # visrl: above the eval seeds; the eval set never chooses


@dataclass
class RayConfig:
    address: Optional[str] = None  # None: RAY_ADDRESS, or a new local cluster; "auto" joins a running one
    namespace: Optional[str] = None  # None: visrl-<run_name>-<8 hex>, new each run, so runs never share actor names
    include_dashboard: bool = False
    # visrl: more environment variables to pass from the driver to every actor, beside the ones always
    # passed (Hugging Face and AWS settings: placement/runtime_env.py)
    forward_env: List[str] = field(default_factory=list)


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
    "trainer.logger": ("tensorboard", "console", "mlflow", "wandb"),
    "trainer.algorithm.advantage_estimator": tuple(ADVANTAGE_ESTIMATORS),
    "trainer.algorithm.policy_loss_type": tuple(POLICY_LOSSES),
    "trainer.algorithm.kl_estimator_type": tuple(KL_ESTIMATORS),
    "trainer.algorithm.loss_reduction": LOSS_REDUCTIONS,
    "trainer.policy.optimizer_config.scheduler": ("constant_with_warmup", "cosine_with_warmup"),
    "generator.inference_engine.backend": ("hf", "vllm"),
}

# SkyRL keys a SkyRL user may pass that visrl does not implement: refused with the reason.
UNSUPPORTED: dict[str, str] = {
    "trainer.critic": "visrl trains without a critic (GRPO and RLOO need none)",
    "trainer.reward": "the reward comes from the environment, not a reward model",
    "trainer.placement.colocate_policy_ref": "colocate_all places policy and ref together already",
    "trainer.placement.colocate_critic_reward": "there is no critic or reward model",
    "trainer.placement.critic_num_nodes": "there is no critic",
    "trainer.placement.critic_num_gpus_per_node": "there is no critic",
    "trainer.placement.reward_num_nodes": "there is no reward model",
    "trainer.placement.reward_num_gpus_per_node": "there is no reward model",
    "trainer.sequence_parallel_backend": "sequence parallelism is not implemented",
    "trainer.policy.sequence_parallel_size": "sequence parallelism is not implemented",
    "trainer.ref.sequence_parallel_size": "sequence parallelism is not implemented",
    "trainer.policy.deepspeed_config": "only FSDP2 is implemented", "trainer.ref.deepspeed_config": "only FSDP2 is implemented",
    "trainer.policy.use_torch_compile": "not implemented", "trainer.policy.record_memory": "not implemented",
    "trainer.policy.optimizer_config.offload_after_step": "not implemented",
    "trainer.policy.fsdp_config.reshard_after_forward": "FSDP2's default (reshard) is used",
    "trainer.policy.fsdp_config.fsdp_size": "every policy device is one FSDP2 rank",
    "trainer.ref.fsdp_config.reshard_after_forward": "FSDP2's default (reshard) is used",
    "trainer.ref.fsdp_config.fsdp_size": "every ref device is one FSDP2 rank",
    "trainer.algorithm.kl_ctrl": "KL in the reward is not implemented (use_kl_loss is)",
    "trainer.algorithm.use_kl_in_reward": "KL in the reward is not implemented (use_kl_loss is)",
    "trainer.algorithm.use_kl_estimator_k3": "deprecated in SkyRL; use trainer.algorithm.kl_estimator_type=k3",
    "trainer.algorithm.use_abs_kl": "deprecated in SkyRL; use trainer.algorithm.kl_estimator_type",
    "trainer.algorithm.advantage_batch_normalize": "not implemented",
    "trainer.algorithm.value_head_prefix": "there is no critic", "trainer.algorithm.value_clip": "there is no critic",
    "trainer.algorithm.lambd": "GAE is not implemented",
    "trainer.algorithm.gamma": "GAE is not implemented (GiGPO's discount is trainer.algorithm.gigpo.gamma)",
    "trainer.algorithm.normalize_reward": "rewards are the env's 0/1",
    "trainer.algorithm.dynamic_sampling": "use trainer.algorithm.filter_zero_advantage_groups",
    "trainer.bf16": "the dtype follows the device (bf16 on cuda, fp32 on cpu)",
    "trainer.critic_mini_batch_size": "there is no critic", "trainer.update_ref_every_epoch": "not implemented",
    "trainer.use_sample_packing": "sequences are padded, not packed",
    "trainer.flash_attn": "the model's default attention is used",
    "trainer.disable_fast_tokenizer": "the fast tokenizer is always used",
    "trainer.target_modules": "use trainer.policy.model.lora.target_modules", "trainer.use_orm_score": "not implemented",
    "trainer.dump_data_batch": "not implemented", "trainer.dump_eval_results": "eval results always go to <run_dir>/eval/",
    "generator.model_dtype": "the dtype follows the device", "generator.run_engines_locally": "engines are always Ray actors",
    "generator.num_inference_engines": "use generator.inference_engine.num_engines",
    "generator.backend": "use generator.inference_engine.backend",
    "generator.inference_engine_tensor_parallel_size": "use generator.inference_engine.tensor_parallel_size",
    "generator.gpu_memory_utilization": "use generator.inference_engine.gpu_memory_utilization",
    "generator.weight_sync_backend": "adapters travel through shared storage (docs/design.md)",
    "generator.weight_transfer_threshold_cuda_ipc_GB": "adapters travel through shared storage",
    "generator.async_engine": "not implemented", "generator.batched": "every live episode of a turn is one batch",
    "generator.vllm_v1_disable_multiproc": "use generator.inference_engine.engine_init_kwargs",
    "generator.enable_prefix_caching": "use generator.inference_engine.engine_init_kwargs",
    "generator.enable_chunked_prefill": "use generator.inference_engine.engine_init_kwargs",
    "generator.max_num_batched_tokens": "use generator.inference_engine.engine_init_kwargs",
    "generator.enforce_eager": "use generator.inference_engine.engine_init_kwargs",
    "generator.max_num_seqs": "use generator.inference_engine.engine_init_kwargs",
    "generator.remote_inference_engine_urls": "engines are Ray actors of this run",
    "generator.enable_http_endpoint": "serve adapters with serve_app.py", "generator.http_endpoint_host": "see serve_app.py",
    "generator.http_endpoint_port": "see serve_app.py", "generator.override_existing_update_group": "not implemented",
    "generator.sampling_params.repetition_penalty": "not implemented", "generator.sampling_params.min_p": "not implemented",
    "generator.sampling_params.top_k": "not implemented", "generator.sampling_params.logprobs": "log-probs are always kept",
    "generator.sampling_params.stop": "an answer ends at <|im_end|>",
    "generator.eval_sampling_params.repetition_penalty": "not implemented",
    "generator.eval_sampling_params.top_p": "not implemented", "generator.eval_sampling_params.min_p": "not implemented",
    "generator.eval_sampling_params.top_k": "not implemented", "generator.eval_sampling_params.logprobs": "not needed",
    "generator.eval_sampling_params.stop": "an answer ends at <|im_end|>",
    "generator.eval_n_samples_per_prompt": "evaluation plays each maze once",
    "generator.use_conversation_multi_turn": "turns are always chat messages",
    "generator.append_eos_token_after_stop_str_in_multi_turn": "an answer ends at <|im_end|>",
    "generator.zero_reward_on_non_stop": "the env rewards only a stop on the goal",
    "generator.apply_overlong_filtering": "not implemented",
    "data.train_data": "mazes come from data.dataset_dir (python driver.py --make-dataset)",
    "data.val_data": "use data.eval_set",
}
