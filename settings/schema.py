"""The typed configuration, the lowest layer: every other package types its `cfg` with these classes.

Key names follow SkyRL's, so its command lines work verbatim. Every field is a `setting` with its
default, its help and its check; a section's `check()` holds the rules that span its fields, and
`Config.check()` those that span sections. `configs/default.yaml` is the embedded CPU run and
`configs/hyperpod_qwen3vl_8b.yaml` the reference run on 3 nodes x 2 GPUs. Keys SkyRL does not have
are marked `visrl=True`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from settings.fields import ConfigError, check_fields, section, setting

# The names the algorithm's registries (rl/algorithm.py) implement, one each; tests check they agree.
ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "gigpo")
POLICY_LOSSES = ("regular", "dual_clip")
KL_ESTIMATORS = ("k1", "k2", "k3")
LOSS_REDUCTIONS = ("token_mean", "sequence_mean", "sampled_token_mean")
POSITIVE = {"at_least": 1}


@dataclass
class LoraConfig:
    rank: int = setting(16, "LoRA rank", **POSITIVE)
    alpha: int = setting(32, "LoRA alpha (the update scales by alpha / rank)")
    dropout: float = setting(0.0, "LoRA dropout", at_least=0, at_most=1)
    target_modules: str = setting("all-linear", "all-linear (every linear layer, the vision tower's too) or a "
                                                "comma-separated list of module names")
    init_from: Optional[str] = setting(
        None, "a PEFT adapter (folder or s3:// prefix, e.g. an earlier run's exports/global_step_N/policy) the "
              "run's adapter starts from, with a fresh optimizer: a curriculum's next stage. Same rank, alpha and "
              "target modules; a checkpoint to resume from takes precedence", visrl=True)


@dataclass
class ModelConfig:
    path: str = setting("assets/maze-vl-base", "local folder, s3://bucket/prefix or a Hugging Face id")
    speedups: bool = setting(
        True, "visrl's speed-ups of transformers' Qwen3-VL code, wherever the model runs (trainer, reference, hf "
              "engine): one attention call for all pictures, each distinct picture encoded once, the patch embedding as "
              "one matmul, fused RMSNorms and the LoRA update as one addmm on a GPU (trainer and hf engine), the rotary index in "
              "numpy, and the hf engine's own decode loop replayed as CUDA graphs; false runs transformers' code as it "
              "is (the serve app's switch: its `speedups` argument)", visrl=True)
    compile_layers: bool = setting(
        False, "torch.compile each decoder layer of the trainer's policy (dynamic shapes, one graph shared by the "
               "layers): fused elementwise kernels and less host dispatch a layer, where the 8B train pass waits on "
               "the host (1.19x there); the CPU's pass gains nothing. The first pass pays the compilation (tens of "
               "seconds), and the figures differ from the eager pass by rounding", visrl=True)
    lora: LoraConfig = section(LoraConfig, "the adapter that trains on the frozen base")


@dataclass
class OptimizerConfig:
    lr: float = setting(1e-4, "learning rate", above=0)
    adam_betas: List[float] = setting([0.9, 0.999], "AdamW's betas")
    weight_decay: float = setting(0.0, "AdamW's weight decay", at_least=0)
    max_grad_norm: float = setting(1.0, "gradients are clipped to this norm", above=0)
    num_warmup_steps: int = setting(0, "training steps (batches) of linear warm-up", at_least=0)
    scheduler: str = setting("constant_with_warmup", "the learning rate after warm-up",
                             choices=("constant_with_warmup", "cosine_with_warmup"))


@dataclass
class FsdpConfig:
    cpu_offload: bool = setting(False, "FSDP2's parameter and optimizer offload to the host")
    fsdp_size: int = setting(
        -1, "the shard group: -1 shards over every device of the pool; N shards inside groups of N consecutive "
            "devices (a node's) and replicates across them (hybrid); 1 keeps the whole base on every device and "
            "all-reduces only the LoRA gradients (docs/cluster.md)", at_least=-1)
    record_collectives: bool = setting(
        False, "count every collective the shards issue as comm/* metrics (bytes and seconds by process group); "
               "each then waits for its own end, so steps run slower while it is on", visrl=True)


@dataclass
class PolicyConfig:
    model: ModelConfig = section(ModelConfig, "the model the policy trains")
    optimizer_config: OptimizerConfig = section(OptimizerConfig, "the policy's optimizer")
    fsdp_config: FsdpConfig = section(FsdpConfig, "the policy shards' FSDP2")


@dataclass
class RefConfig:
    fsdp_config: FsdpConfig = section(FsdpConfig, "the reference shards' FSDP2")
    from_policy_base: bool = setting(
        True, "the reference is the policy's frozen base (LoRA trains on top of it), so the policy shards score "
              "it with the adapter switched off and no RefShard is placed; false places SkyRL's separate "
              "RefShards (the same numbers, one more copy of the base on each device)", visrl=True)


@dataclass
class PlacementConfig:
    colocate_all: bool = setting(True, "engines and shards share each device (engines sleep while shards train)")
    policy_num_nodes: int = setting(1, "nodes of policy shards", **POSITIVE)
    policy_num_gpus_per_node: int = setting(1, "policy shards a node", **POSITIVE)
    ref_num_nodes: int = setting(1, "nodes of ref shards (with trainer.ref.from_policy_base=false)", **POSITIVE)
    ref_num_gpus_per_node: int = setting(1, "ref shards a node", **POSITIVE)
    cpus_per_bundle: float = setting(1.0, "CPUs in each per-device bundle", above=0, visrl=True)
    device_resource: Optional[str] = setting(
        None, "a custom resource each per-device bundle also asks one of: picks a node type, or stands in for "
              "GPUs on CPU nodes (deploy/local_cluster.py gives its workers `visrl_device` slots)", visrl=True)
    timeout_s: float = setting(120.0, "give up on an unsatisfiable placement group after this, at start (seconds)",
                               above=0, visrl=True)
    recovery_timeout_s: float = setting(
        1200.0, "after a lost node, how long recovery waits for the cluster to place the groups again (a platform "
                "replacing a node takes minutes)", above=0, visrl=True)


@dataclass
class GiGPOConfig:
    """`trainer.algorithm.gigpo`: the paper's defaults (verl-agent's `algorithm.gigpo`, `algorithm.gamma`)."""
    step_advantage_w: float = setting(1.0, "weight of the step-level advantage")
    gamma: float = setting(0.95, "discount of the step-level returns", at_least=0, at_most=1)
    stay_penalty: float = setting(
        0.0, "taken off the step-level reward of a turn that leaves the env's state as it was (a wall hit, an "
             "answer that is no action); episode scores stay the env's own rewards", at_least=0, visrl=True)
    progress_reward: float = setting(
        0.0, "added to the step-level reward of a turn, times how much nearer the goal its action took the env "
             "(Environment.progress: for sliding blocks, the share of blocks on their target cells; for mazes, of the "
             "starting route behind the agent); episode scores stay the env's own rewards", at_least=0, visrl=True)


@dataclass
class AlgorithmConfig:
    """`trainer.algorithm`: SkyRL's keys; the names come from rl/algorithm.py's registries."""
    advantage_estimator: str = setting("grpo", "how episodes are scored against their group",
                                       choices=ADVANTAGE_ESTIMATORS)
    grpo_norm_by_std: bool = setting(True, "divide group-relative advantages by the group's std")
    policy_loss_type: str = setting("regular", "regular: PPO-clip; dual_clip also caps a negative advantage's loss",
                                    choices=POLICY_LOSSES)
    use_kl_loss: bool = setting(True, "a KL term to the reference in the loss")
    kl_loss_coef: float = setting(0.001, "its weight", at_least=0)
    kl_estimator_type: str = setting("k3", "which estimator of the KL", choices=KL_ESTIMATORS)
    eps_clip_low: float = setting(0.2, "PPO's clip range below a ratio of 1", at_least=0)
    eps_clip_high: float = setting(0.2, "PPO's clip range above a ratio of 1 (DAPO's clip-higher raises it)", at_least=0)
    clip_ratio_c: float = setting(3.0, "dual_clip's cap on a negative advantage's loss, in units of |A|", above=1,
                                  note="dual_clip caps a negative advantage's loss at clip_ratio_c x |A|")
    loss_reduction: str = setting("token_mean", "how a mini-batch's loss averages its tokens", choices=LOSS_REDUCTIONS)
    entropy_coef: float = setting(0.0, "weight of an entropy bonus")
    filter_zero_advantage_groups: bool = setting(False, "drop all-equal groups from the update", visrl=True)
    use_rollout_logprobs: bool = setting(False, "the engines' sampling log-probs as the old policy", visrl=True)
    use_tis: bool = setting(False, "truncated importance sampling: recomputed old policy, corrected toward the engines'")
    tis_imp_ratio_cap: float = setting(2.0, "the cap C of the TIS weight min(pi_old / pi_engine, C)")
    gigpo: GiGPOConfig = section(GiGPOConfig, "with advantage_estimator=gigpo")

    def check(self) -> None:
        if self.use_tis and self.use_rollout_logprobs:
            raise ConfigError("trainer.algorithm.use_tis corrects the trainer's recomputed old log-probs toward the "
                              "engines'; with use_rollout_logprobs=true the ratio is already taken against the "
                              "engines' log-probs: set one of the two")
        if self.use_tis and self.tis_imp_ratio_cap <= 0:
            raise ConfigError(f"trainer.algorithm.tis_imp_ratio_cap must be > 0; got {self.tis_imp_ratio_cap}")


@dataclass
class FullyAsyncConfig:
    """`trainer.fully_async`: SkyRL's keys for generation that overlaps training (controller/rollouts.py)."""
    enabled: bool = setting(
        False, "one-step-off: the engines generate the next step's rollouts, with the adapter one step behind, "
               "while the shards train on this step's; needs engines that stay awake (colocate_all=false, or "
               "generator.inference_engine.enable_sleep=false) and trainer.algorithm.use_tis")
    max_staleness_steps: int = setting(
        1, "adapter versions the rollouts may lag the trainer", at_least=1, at_most=1,
        note="1 only: batches are generated one after another, so one more ahead would only wait in line")


@dataclass
class TrainerConfig:
    epochs: int = setting(20, "passes over the train set", **POSITIVE)
    train_batch_size: int = setting(8, "prompts a step", **POSITIVE)
    policy_mini_batch_size: int = setting(8, "prompts an optimizer step", **POSITIVE)
    micro_forward_batch_size_per_gpu: int = setting(16, "sequences a forward pass (reference scoring)", **POSITIVE)
    micro_train_batch_size_per_gpu: int = setting(16, "sequences a forward and backward pass", **POSITIVE)
    max_tokens_per_micro_batch: int = setting(
        0, "padded tokens a micro-batch of the trainer's or the reference's passes may hold (its sequences times "
           "its longest), besides the counts above: memory bounded whatever the episodes' lengths (long answers, "
           "many turns), as verl's use_dynamic_bsz with ppo_max_token_len_per_gpu", at_least=0,
        note="0 cuts by count alone", visrl=True)
    update_epochs_per_batch: int = setting(1, "passes over each batch", **POSITIVE)
    gradient_checkpointing: bool = setting(
        False, "recompute each block's activations in the backward pass instead of holding them: far less memory "
               "for a little more compute, so micro-batches can grow (non-reentrant only)")
    gradient_checkpointing_use_reentrant: bool = setting(False, "refused: reentrant checkpointing loses LoRA gradients")
    max_prompt_length: int = setting(2048, "the first turn's prompt (instruction and picture) must fit", **POSITIVE)
    eval_batch_size: int = setting(0, "eval mazes run at once", at_least=0, note="0 = all mazes at once")
    strategy: str = setting("fsdp2", "fsdp and fsdp2 both run FSDP2's fully_shard (FSDP1 is not supported)",
                            choices=("fsdp", "fsdp2"))
    seed: int = setting(42, "the run's seed (data order, sampling, initialisation)")
    device: str = setting("auto", "where shards and engines compute", choices=("auto", "cpu", "cuda"), visrl=True)
    eval_interval: int = setting(5, "steps between evaluations", **POSITIVE)
    eval_before_train: bool = setting(True, "evaluate the starting policy at step 0")
    ckpt_interval: int = setting(10, "steps between checkpoints", **POSITIVE)
    hf_save_interval: int = setting(10, "steps between adapter exports", **POSITIVE)
    resume_mode: str = setting("latest", "none | latest | from_path", choices=("none", "latest", "from_path"))
    resume_path: Optional[str] = setting(None, "with resume_mode=from_path: a checkpoint folder global_step_N")
    ckpt_path: str = setting("runs/default/ckpts", "checkpoints: a folder or s3://bucket/prefix")
    export_path: str = setting("runs/default/exports", "adapter exports: a folder or s3://bucket/prefix")
    publish_path: Optional[str] = setting(
        None, "the serving prefix `tools/publish.py NAME` writes <publish_path>/NAME/ under: what the serve "
              "app's (and ray.serve.llm's) dynamic_lora_loading_path reads", visrl=True)
    max_ckpts_to_keep: int = setting(-1, "checkpoints kept (-1: all)")
    max_restarts: int = setting(10, "actor-group rebuilds (each a lost actor or node) before the run gives up",
                                at_least=0, visrl=True)
    fail_on_ckpt_error: bool = setting(False, "stop the run when a checkpoint cannot be saved", visrl=True)
    ckpt_timeout_s: float = setting(120.0, "longest a checkpoint save may hold up a step", above=0, visrl=True)
    hours_between_failures: Optional[float] = setting(
        None, "the hours a run expects between failures (a lost node, a preemption): after its first step the "
              "driver prints the checkpoint interval the MTTF/3 rule gives at this run's step time", above=0,
        visrl=True)
    preemption_timeout_s: float = setting(
        60.0, "after SIGTERM (a spot reclaim, a drain, a pod deletion), the longest the driver takes to save the "
              "run's state and exit with status 75; give the platform's grace period more", above=0, visrl=True)
    stop_after_step: int = setting(0, "end this invocation after that step (0 = run to the end); resume later",
                                   at_least=0, visrl=True)
    run_dir: str = setting("runs/default", "metrics.jsonl, TensorBoard events, curve, config", visrl=True)
    project_name: str = setting("visrl", "labels the progress bar and the tracker's project")
    run_name: str = setting("default", "labels the progress bar, the tracker's run and the metrics")
    logger: List[str] = setting(
        ["tensorboard"], "where a step's numbers go beside metrics.jsonl and the console (which always get "
                         "them): any of these, as a list (trainer.logger=[tensorboard,wandb]) or one name; a resumed "
                         "run continues the same MLflow and W&B runs", choices=("tensorboard", "console", "mlflow", "wandb"))
    placement: PlacementConfig = section(PlacementConfig, "devices, nodes and colocation")
    policy: PolicyConfig = section(PolicyConfig, "the trained policy")
    ref: RefConfig = section(RefConfig, "the KL term's reference")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "advantages, loss, KL")
    fully_async: FullyAsyncConfig = section(FullyAsyncConfig, "rollouts generated while the shards train")

    def ref_source(self) -> str:
        """Who scores the KL term's reference: "none" without a KL loss, "policy" for the policy
        shards' frozen base with the adapter off (`ref.from_policy_base`), else "shards" (RefShards)."""
        if not self.algorithm.use_kl_loss:
            return "none"
        return "policy" if self.ref.from_policy_base else "shards"

    def check(self) -> None:
        if self.train_batch_size % self.policy_mini_batch_size:
            raise ConfigError(f"trainer.train_batch_size ({self.train_batch_size}) must be divisible by "
                              f"trainer.policy_mini_batch_size ({self.policy_mini_batch_size})")
        if self.gradient_checkpointing_use_reentrant:
            raise ConfigError("trainer.gradient_checkpointing_use_reentrant=true is not supported: reentrant "
                              "checkpointing loses the LoRA gradients when a block's input comes from the frozen base "
                              "(nothing upstream needs a gradient); leave it false")
        if self.policy.model.compile_layers and self.gradient_checkpointing:
            raise ConfigError("trainer.policy.model.compile_layers with trainer.gradient_checkpointing=true: transformers "
                              "runs a recomputed layer past its compiled call, so nothing would be compiled; compile "
                              "without recompute (micro-batches bounded by trainer.max_tokens_per_micro_batch) or set "
                              "compile_layers=false")
        if self.resume_mode == "from_path" and not self.resume_path:
            raise ConfigError("trainer.resume_mode=from_path needs trainer.resume_path")
        if self.resume_mode == "from_path" and not re.fullmatch(r"global_step_\d+",
                                                                self.resume_path.rstrip("/").rsplit("/", 1)[-1]):
            raise ConfigError(f"trainer.resume_path must name a checkpoint folder ending in global_step_N; "
                              f"got '{self.resume_path}'")
        self.algorithm.check()


@dataclass
class SamplingParams:
    max_generate_length: int = setting(16, "new tokens a turn", **POSITIVE)
    temperature: float = setting(1.0, "the rollouts' temperature", above=0,
                                 note="training rollouts sample; eval uses generator.eval_sampling_params")
    top_p: float = setting(1.0, "nucleus sampling", above=0, at_most=1)


@dataclass
class EvalSamplingParams:
    max_generate_length: int = setting(16, "new tokens a turn", **POSITIVE)
    temperature: float = setting(0.0, "0 = greedy", at_least=0)


@dataclass
class InferenceEngineConfig:
    backend: str = setting("hf", "hf | vllm", choices=("hf", "vllm"))
    num_engines: int = setting(1, "engines (one a device when colocated)", **POSITIVE)
    tensor_parallel_size: int = setting(1, "devices an engine spans (vllm only)", **POSITIVE)
    gpu_memory_utilization: float = setting(0.45, "share of a GPU's memory vLLM may take", above=0, at_most=1)
    enable_sleep: bool = setting(True, "engines free memory while shards train (colocate_all)", visrl=True)
    cpu_kv_cache_gib: float = setting(2.0, "vLLM's KV cache on a CPU machine (VLLM_CPU_KVCACHE_SPACE)", above=0,
                                      visrl=True)
    merge_lora: bool = setting(
        False, "the hf backend on a GPU merges each adapter version into its bf16 weights (faster decode, but the "
               "rounding widens the engine-vs-trainer gap ~10x: docs/configuration.md)", visrl=True)
    cuda_graphs: bool = setting(
        True, "the hf backend on a GPU decodes in its own loop, each step replayed as a CUDA graph (false: "
              "transformers' generate); vLLM's own graphs: engine_init_kwargs.enforce_eager", visrl=True)
    engine_init_kwargs: Dict[str, Any] = setting({}, "more vLLM engine arguments, passed as they are")


@dataclass
class GeneratorConfig:
    inference_engine: InferenceEngineConfig = section(InferenceEngineConfig, "the rollout engines")
    sampling_params: SamplingParams = section(SamplingParams, "training rollouts")
    eval_sampling_params: EvalSamplingParams = section(EvalSamplingParams, "evaluation")
    max_turns: int = setting(15, "turns an episode", **POSITIVE)
    max_input_length: int = setting(8192, "tokens a turn's prompt may hold", **POSITIVE)
    n_samples_per_prompt: int = setting(8, "episodes a maze (a group)", **POSITIVE)
    context_window_turns: int = setting(0, "keep only the last K turns (text and picture)", at_least=0,
                                        note="0 keeps all", visrl=True)
    context_pictures: int = setting(0, "of the kept turns, only the last P keep their picture", at_least=0,
                                    note="0 keeps all", visrl=True)
    explore_revisits: float = setting(
        0.0, "chance that a training turn starting where its episode has already been plays a random action "
             "(the task's random_answer) instead of a sampled one, trained as if sampled (ratio 1) on a positive "
             "advantage only",
        at_least=0, at_most=1, note="0: every action sampled; eval never explores", visrl=True)


@dataclass
class EnvironmentConfig:
    env_class: str = setting("maze_2d/easy", "a registered environment (envs/registry.py) or package.module:Class")
    cell_px: int = setting(16, "pixels a cell of the task's grid; match the model (Qwen3-VL: 32)", **POSITIVE)


@dataclass
class DataConfig:
    dataset_dir: str = setting("runs/default/data", "train.jsonl, eval.jsonl, manifest.json", visrl=True)
    train_size: int = setting(256, "mazes in the train set", **POSITIVE)
    eval_size: int = setting(64, "mazes in the eval set", **POSITIVE)
    train_seed_start: int = setting(0, "the train set's first seed")
    eval_seed_start: int = setting(1_000_000, "the eval set's first seed")
    solvable_only: bool = setting(True, "keep only mazes the expert solves within generator.max_turns")
    long_route_share: Optional[float] = setting(None, "share of train mazes with a route longer than the shortest",
                                                at_least=0, at_most=1, note="or null: the mazes as drawn", visrl=True)
    junction_start_share: float = setting(0.0, "share of train mazes that start at a junction of their route",
                                          at_least=0, at_most=1, note="0: every maze starts at its corner", visrl=True)
    detour_start_share: float = setting(0.0, "share of train mazes that start inside a wrong branch, the walk there "
                                             "drawn as trail", at_least=0, at_most=1,
                                        note="0: every maze starts at its corner", visrl=True)
    replay_share: float = setting(0.0, "up to this share of a batch replays mazes whose group came back mixed",
                                  at_least=0, at_most=1, note="0: every maze is drawn once an epoch", visrl=True)
    long_route_repeats: int = setting(1, "a train maze whose route is longer than its env's shortest is drawn this "
                                         "often an epoch", **POSITIVE, visrl=True)
    eval_set: Optional[str] = setting(None, "another eval set (a .jsonl from --make-dataset)", visrl=True)
    validation_size: int = setting(0, "mazes that choose the best adapter at each eval", at_least=0,
                                   note="0 = no validation set", visrl=True)
    validation_seed_start: int = setting(2_000_000, "above the eval seeds; the eval set never chooses", visrl=True)


@dataclass
class RayConfig:
    address: Optional[str] = setting(None, "None: RAY_ADDRESS, or a new local cluster; auto joins a running one")
    namespace: Optional[str] = setting(None, "None: visrl-<run_name>-<8 hex>, new each run, so runs never share "
                                             "actor names")
    include_dashboard: bool = setting(False, "start Ray's dashboard with a new local cluster")
    forward_env: List[str] = setting([], "more environment variables to pass from the driver to every actor, beside "
                                         "the Hugging Face and AWS settings always passed (PYTORCH_CUDA_ALLOC_CONF "
                                         "here replaces the GPU actors' growable allocator segments)", visrl=True)


@dataclass
class S3Config:
    endpoint_url: Optional[str] = setting(None, "an S3-compatible store (MinIO, moto)", visrl=True)
    region: Optional[str] = setting(None, "the bucket's region")
    max_attempts: int = setting(5, "tries of one S3 request", **POSITIVE)
    timeout_s: float = setting(60.0, "connect/read timeout of one S3 request", above=0, visrl=True)


@dataclass
class Config:
    trainer: TrainerConfig = section(TrainerConfig, "training")
    generator: GeneratorConfig = section(GeneratorConfig, "rollouts")
    environment: EnvironmentConfig = section(EnvironmentConfig, "the task")
    data: DataConfig = section(DataConfig, "the datasets")
    ray: RayConfig = section(RayConfig, "the Ray cluster")
    s3: S3Config = section(S3Config, "S3 access")

    def check(self) -> None:
        """Every field's own check, each section's, then the rules that span sections."""
        check_fields(self)
        self.trainer.check()
        t, g, p = self.trainer, self.generator, self.trainer.placement
        if t.train_batch_size > self.data.train_size:
            raise ConfigError(f"trainer.train_batch_size ({t.train_batch_size}) exceeds data.train_size "
                              f"({self.data.train_size})")
        policy_gpus = p.policy_num_nodes * p.policy_num_gpus_per_node
        engine_gpus = g.inference_engine.num_engines * g.inference_engine.tensor_parallel_size
        for pool, devices in (("policy", policy_gpus), ("ref", p.ref_num_nodes * p.ref_num_gpus_per_node)):
            size = getattr(t, pool).fsdp_config.fsdp_size
            if size != -1 and (size < 1 or devices % size):
                raise ConfigError(f"trainer.{pool}.fsdp_config.fsdp_size={size} must be -1 (every device) or divide "
                                  f"the {pool}'s {devices} devices (e.g. a node's: trainer.placement."
                                  f"{pool}_num_gpus_per_node)")
        if t.ref.fsdp_config.record_collectives:
            raise ConfigError("trainer.ref.fsdp_config.record_collectives: only the policy shards' collectives are "
                              "counted; set trainer.policy.fsdp_config.record_collectives=true")
        if p.colocate_all and engine_gpus != policy_gpus:
            raise ConfigError(
                f"trainer.placement.colocate_all=true needs generator.inference_engine.num_engines x "
                f"tensor_parallel_size ({engine_gpus}) == policy_num_nodes x policy_num_gpus_per_node ({policy_gpus})")
        if p.colocate_all and t.ref_source() == "shards" and p.ref_num_nodes * p.ref_num_gpus_per_node != policy_gpus:
            raise ConfigError("trainer.placement.colocate_all=true needs as many ref devices "
                              "(ref_num_nodes x ref_num_gpus_per_node) as policy devices")
        if t.fully_async.enabled and p.colocate_all and g.inference_engine.enable_sleep:
            raise ConfigError("trainer.fully_async.enabled generates while the shards train, so the engines cannot "
                              "sleep: set trainer.placement.colocate_all=false (separate pools) or "
                              "generator.inference_engine.enable_sleep=false (both awake on each device)")
        if t.fully_async.enabled and not t.algorithm.use_tis:
            raise ConfigError("trainer.fully_async.enabled trains on rollouts sampled with the adapter one step "
                              "behind: set trainer.algorithm.use_tis=true (and use_rollout_logprobs=false), the "
                              "loss's correction for it")
        if g.inference_engine.tensor_parallel_size > 1 and g.inference_engine.backend == "hf":
            raise ConfigError("generator.inference_engine.tensor_parallel_size > 1 needs backend=vllm")
        if t.algorithm.advantage_estimator in ("grpo", "rloo", "gigpo") and g.n_samples_per_prompt < 2:
            raise ConfigError(f"{t.algorithm.advantage_estimator} compares samples of one prompt: "
                              f"generator.n_samples_per_prompt must be >= 2; got {g.n_samples_per_prompt}")
