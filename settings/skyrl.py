"""SkyRL keys visrl does not implement, refused by name with the reason (docs/configuration.md lists
them), in whichever layout a SkyRL user writes them: SkyRL's current one (engine keys under
`generator.inference_engine`) or its older flat one (`generator.num_inference_engines`, ...)."""

# Engine keys SkyRL keeps under generator.inference_engine now and directly under generator before: both
# layouts are refused by name with the same reason.
ENGINE_KEYS: dict[str, str] = {
    "model_dtype": "the dtype follows the device", "run_engines_locally": "engines are always Ray actors",
    "weight_sync_backend": "adapters travel through shared storage (docs/design.md)",
    "weight_transfer_threshold_cuda_ipc_GB": "adapters travel through shared storage",
    "pipeline_parallel_size": "pipeline parallelism is not implemented",
    "expert_parallel_size": "expert parallelism is not implemented",
    "data_parallel_size": "use generator.inference_engine.num_engines",
    "async_engine": "one-step-off training is trainer.fully_async; the engines take a turn's requests as one batch",
    "vllm_v1_disable_multiproc": "use generator.inference_engine.engine_init_kwargs",
    "enable_prefix_caching": "use generator.inference_engine.engine_init_kwargs",
    "enable_chunked_prefill": "use generator.inference_engine.engine_init_kwargs",
    "max_num_batched_tokens": "use generator.inference_engine.engine_init_kwargs",
    "enforce_eager": "use generator.inference_engine.engine_init_kwargs",
    "max_num_seqs": "use generator.inference_engine.engine_init_kwargs",
    "fully_sharded_loras": "use generator.inference_engine.engine_init_kwargs",
    "enable_return_routed_experts": "not implemented (no MoE models)",
    "enable_ray_prometheus_stats": "engine metrics come from visrl's own series (docs/observability.md)",
    "remote_urls": "engines are Ray actors of this run", "remote_inference_engine_urls": "engines are Ray actors of this run",
    "enable_http_endpoint": "serve adapters with serve_app.py", "http_endpoint_host": "see serve_app.py",
    "http_endpoint_port": "see serve_app.py", "served_model_name": "see serve_app.py (base_id)",
    "distributed_executor_backend": "use generator.inference_engine.engine_init_kwargs",
    "language_model_only": "the vision tower is part of every task here",
    "override_existing_update_group": "not implemented",
    "external_proxy_url": "engines are Ray actors of this run", "external_server_urls": "engines are Ray actors of this run",
    "enable_pd": "prefill-decode disaggregation is not implemented", "num_prefill": "not implemented",
    "router_init_kwargs": "engines are Ray actors of this run",
}
LEGACY_NAMES = {"num_inference_engines": "num_engines", "inference_engine_tensor_parallel_size": "tensor_parallel_size",
                "backend": "backend", "gpu_memory_utilization": "gpu_memory_utilization"}

# SkyRL's keys of features visrl does not have, in either layout
_OTHER_KEYS: dict[str, str] = {
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
    "trainer.ref.fsdp_config.reshard_after_forward": "FSDP2's default (reshard) is used",
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
    "generator.batched": "every live episode of a turn is one batch",
    "generator.vllm_v1_disable_multiproc": "use generator.inference_engine.engine_init_kwargs",
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

# SkyRL's keys since its dataclass config, beside the ones above
NEWER_KEYS: dict[str, str] = {
    "trainer.fully_async.num_parallel_generation_workers": "one generation stream: every live episode of a turn "
                                                           "goes to the engines in one batch",
    "trainer.log_path": "logs go to trainer.run_dir and Ray's session folder",
    "trainer.rope_scaling": "the model's own rotary settings are used",
    "trainer.rope_theta": "the model's own rotary settings are used",
    "trainer.policy.model.lora.lora_sync_path": "adapters sync under trainer.run_dir/adapters",
    "trainer.policy.model.lora.exclude_modules": "use trainer.policy.model.lora.target_modules",
    "trainer.policy.model.lora.init_method": "PEFT's default initialisation (B = 0) is used",
    "trainer.policy.model_config_kwargs": "not implemented", "trainer.ref.model_config_kwargs": "not implemented",
    "trainer.ref.model": "the reference is the policy's base model",
    "trainer.algorithm.off_policy_correction": "use trainer.algorithm.use_tis and tis_imp_ratio_cap",
    "trainer.algorithm.use_entropy_loss": "use trainer.algorithm.entropy_coef",
    "trainer.algorithm.entropy_loss_coef": "use trainer.algorithm.entropy_coef",
    "trainer.algorithm.zero_variance_filter": "use trainer.algorithm.filter_zero_advantage_groups",
    "trainer.algorithm.max_seq_len": "not implemented", "trainer.algorithm.temperature": "the rollouts' temperature is used",
    "trainer.algorithm.sapo": "not implemented", "trainer.algorithm.clip_cov": "not implemented",
    "trainer.algorithm.kl_cov": "not implemented", "trainer.algorithm.cispo": "not implemented",
    "generator.chat_template": "the model's own chat template is used",
    "generator.chat_template_kwargs": "the model's own chat template is used",
    "generator.rope_scaling": "the model's own rotary settings are used",
    "generator.rope_theta": "the model's own rotary settings are used",
    "generator.step_wise_trajectories": "every turn is trained as its own sequence already",
    "environment.skyrl_gym": "tasks are visrl environments (envs/base.py)",
}


def _both_layouts() -> dict[str, str]:
    keys = {}
    for leaf, why in ENGINE_KEYS.items():
        keys[f"generator.{leaf}"] = keys[f"generator.inference_engine.{leaf}"] = why
    for old, new in LEGACY_NAMES.items():
        keys[f"generator.{old}"] = f"use generator.inference_engine.{new}"
    return keys


UNSUPPORTED: dict[str, str] = _OTHER_KEYS | NEWER_KEYS | _both_layouts()
