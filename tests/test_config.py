"""Config: the reference run's keys verbatim, typos with suggestions, cross-field checks, --dry-run."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from settings import ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent

# The reference run's command line, verbatim (quotes included), as docs/configuration.md quotes it.
SEED_KEYS = """
trainer.epochs=20 trainer.train_batch_size=24 trainer.policy_mini_batch_size=12
trainer.micro_forward_batch_size_per_gpu=1 trainer.micro_train_batch_size_per_gpu=1
trainer.update_epochs_per_batch=1 trainer.max_prompt_length=2048
generator.sampling_params.max_generate_length=1024 generator.sampling_params.temperature=0.7
generator.max_turns=15 generator.max_input_length=8192 generator.n_samples_per_prompt=8
generator.inference_engine.num_engines=6 generator.inference_engine.tensor_parallel_size=1
generator.inference_engine.gpu_memory_utilization=0.45
generator.inference_engine.engine_init_kwargs.max_model_len=16000
trainer.algorithm.advantage_estimator=grpo trainer.policy.model.lora.rank=32
trainer.policy.model.lora.alpha=32 trainer.placement.colocate_all=true trainer.strategy=fsdp
trainer.placement.policy_num_nodes=3 trainer.placement.policy_num_gpus_per_node=2
trainer.placement.ref_num_nodes=3 trainer.placement.ref_num_gpus_per_node=2
trainer.ref.fsdp_config.cpu_offload=false trainer.eval_interval=10 trainer.eval_before_train=true
trainer.ckpt_interval=20 trainer.hf_save_interval=20 trainer.resume_mode=latest
trainer.ckpt_path="s3://<bucket>/skyrl-visgym/ckpts/sft-grpo" trainer.export_path="/shared/runs/<run>-train"
""".split()
# ...with its placeholders filled in, as a launch must: a placeholder left in is refused
FILLED = [k.replace("<bucket>", "maze-bucket").replace("<run>", "maze1") for k in SEED_KEYS]


def test_every_seed_key_is_accepted_verbatim():
    cfg = load_config(None, FILLED + ["generator.inference_engine.backend=vllm", "data.train_size=256"])
    assert cfg.trainer.train_batch_size == 24 and cfg.trainer.policy_mini_batch_size == 12
    assert cfg.generator.sampling_params.temperature == 0.7
    assert cfg.generator.inference_engine.engine_init_kwargs == {"max_model_len": 16000}
    assert cfg.trainer.ckpt_path == "s3://maze-bucket/skyrl-visgym/ckpts/sft-grpo"
    assert cfg.trainer.export_path == "/shared/runs/maze1-train"
    assert cfg.trainer.placement.policy_num_nodes == 3 and cfg.trainer.ref.fsdp_config.cpu_offload is False


def test_a_placeholder_left_in_is_refused_before_it_names_a_folder():
    with pytest.raises(ConfigError, match=r"'trainer.ckpt_path' still holds the placeholder <bucket>.*"
                                          r"trainer.ckpt_path=s3://my-bucket/skyrl-visgym"):
        load_config(None, SEED_KEYS)
    with pytest.raises(ConfigError, match="'trainer.export_path' still holds the placeholder <run>"):
        load_config(None, ["trainer.export_path=/shared/runs/<run>-train"])
    assert load_config(None, ["generator.sampling_params.max_generate_length=8"])  # no placeholder, no error


def test_both_shipped_configs_load():
    default = load_config(ROOT / "configs/default.yaml")
    ref = load_config(ROOT / "configs/hyperpod_qwen3vl_8b.yaml", ["trainer.ckpt_path=s3://b/ckpts"])
    assert default.trainer.device == "cpu" and default.generator.inference_engine.backend == "hf"
    assert ref.generator.inference_engine.num_engines == 6 and ref.trainer.placement.colocate_all
    assert ref.environment.env_class == "maze_2d/easy"


# stage 3 of the hard curriculum as bench/README.md measured it: hard.yaml and this command line
HARD_STAGE3_COMMAND_LINE = ["trainer.epochs=1", "data.train_size=1024", "data.train_seed_start=500000",
                            "trainer.policy.optimizer_config.lr=5.0e-4", "trainer.algorithm.gigpo.stay_penalty=0.05",
                            "generator.context_window_turns=4",
                            "trainer.run_dir=runs/hard-stage3",
                            "trainer.policy.model.lora.init_from=runs/hard/exports/global_step_96/policy"]


def test_a_config_that_extends_another_is_that_config_with_its_changes():
    stage3 = load_config(ROOT / "configs/hard_stage3.yaml")
    assert stage3 == load_config(ROOT / "configs/hard.yaml", HARD_STAGE3_COMMAND_LINE)
    assert stage3 != load_config(ROOT / "configs/hard.yaml", ["trainer.run_dir=runs/hard-stage3"])
    assert stage3.data.dataset_dir == "runs/hard-stage3/data"  # hard.yaml's ${trainer.run_dir} resolves after the merge


def test_extends_errors_name_the_file(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    with pytest.raises(ConfigError, match=r"'.*b.yaml' \(named by `extends:` in '.*a.yaml'\) does not exist"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="extends itself"):
        load_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("trainer:\n  epoch: 2\n")  # a typo in the file extended is still named
    with pytest.raises(ConfigError, match=r"b.yaml: unknown config key 'trainer.epoch'; did you mean 'trainer.epochs'"):
        load_config(tmp_path / "a.yaml")


@pytest.mark.parametrize("override, names", [
    ("trainer.train_batch_sise=3", ["trainer.train_batch_sise", "trainer.train_batch_size"]),
    ("generator.sampling_params.temprature=1", ["temprature", "generator.sampling_params.temperature"]),
    ("trainer.polcy.model.path=x", ["trainer.polcy", "trainer.policy.model.path"]),
])
def test_unknown_keys_name_the_closest_valid_key(override, names):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    for name in names:
        assert name in str(e.value)


@pytest.mark.parametrize("override, words", [
    ("trainer.train_batch_size=abc", ["trainer.train_batch_size", "int"]),
    ("trainer.eval_before_train=maybe", ["trainer.eval_before_train", "bool"]),
    ("generator.sampling_params.temperature=hot", ["temperature", "float"]),
])
def test_wrong_types_name_key_and_expected_type(override, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("overrides, words", [
    (["trainer.train_batch_size=8", "trainer.policy_mini_batch_size=3"], ["divisible"]),
    (["generator.inference_engine.num_engines=2"], ["colocate_all", "num_engines"]),
    (["trainer.algorithm.kl_estimator_type=k9"], ["k1, k2, k3"]),
    (["generator.n_samples_per_prompt=1"], ["n_samples_per_prompt"]),
    (["trainer.resume_mode=from_path"], ["resume_path"]),
    (["trainer.epochs"], ["key=value"]),
    (["trainer.gradient_checkpointing_use_reentrant=true"], ["use_reentrant", "leave it false"]),
    (["trainer.policy.model.compile_layers=true", "trainer.gradient_checkpointing=true"],
     ["compile_layers", "nothing would be compiled", "max_tokens_per_micro_batch"]),
    (["data.long_route_repeats=0"], ["data.long_route_repeats", ">= 1"]),
    (["data.long_route_share=1.5"], ["data.long_route_share", "between 0 and 1"]),
    (["data.junction_start_share=-0.1"], ["data.junction_start_share", "between 0 and 1"]),
    (["data.replay_share=2"], ["data.replay_share", "between 0 and 1"]),
    (["data.validation_size=-1"], ["data.validation_size", ">= 0"]),
    (["trainer.algorithm.use_tis=true", "trainer.algorithm.use_rollout_logprobs=true"], ["use_tis", "one of the two"]),
    (["trainer.algorithm.use_tis=true", "trainer.algorithm.use_rollout_logprobs=false", "trainer.algorithm.tis_imp_ratio_cap=0"],
     ["tis_imp_ratio_cap", "> 0"]),
    (["trainer.placement.policy_num_gpus_per_node=2", "trainer.placement.ref_num_gpus_per_node=2",
      "generator.inference_engine.num_engines=2", "trainer.policy.fsdp_config.fsdp_size=3"],
     ["trainer.policy.fsdp_config.fsdp_size=3", "divide the policy's 2 devices"]),
    (["trainer.ref.fsdp_config.fsdp_size=0"], ["trainer.ref.fsdp_config.fsdp_size=0", "-1 (every device)"]),
    (["trainer.ref.fsdp_config.record_collectives=true"], ["trainer.policy.fsdp_config.record_collectives=true"]),
    # one-step-off: engines that sleep while the shards train cannot generate then; the stale sampler needs TIS
    (["trainer.fully_async.enabled=true", "trainer.algorithm.use_tis=true", "trainer.algorithm.use_rollout_logprobs=false"],
     ["cannot sleep", "colocate_all=false", "enable_sleep=false"]),
    (["trainer.fully_async.enabled=true", "trainer.placement.colocate_all=false"], ["use_tis=true", "one step"]),
    (["trainer.fully_async.max_staleness_steps=2"], ["max_staleness_steps", "between 1 and 1", "1 only"]),
])
def test_cross_field_and_choice_checks(overrides, words):
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides)
    for w in words:
        assert w in str(e.value)


def run_driver(*args):
    return subprocess.run([sys.executable, "driver.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_dry_run_of_the_reference_config_prints_six_engines_on_three_nodes():
    template = run_driver("--dry-run", "--config", "configs/hyperpod_qwen3vl_8b.yaml")
    assert template.returncode == 2 and "<bucket>" in template.stderr  # the bucket is the user's to fill
    out = run_driver("--dry-run", "--config", "configs/hyperpod_qwen3vl_8b.yaml", "trainer.ckpt_path=s3://b/ckpts")
    assert out.returncode == 0, out.stderr
    assert "export_path: /shared/runs/sft-grpo-train" in out.stdout  # the run's name, not a placeholder
    assert "6 engines on 3 nodes" in out.stdout
    for rank in range(6):
        assert f"VLLMEngine-{rank}" in out.stdout and f"FSDPPolicyShard-{rank}" in out.stdout
    assert out.stdout.count("placement group colocated-node") == 3
    assert "train_batch_size: 24" in out.stdout  # the resolved config is printed too


def test_dry_run_accepts_the_seed_command_line_and_rejects_typos_with_status_2():
    ok = run_driver("--dry-run", *FILLED)
    assert ok.returncode == 0, ok.stderr
    assert "6 engines on 3 nodes" in ok.stdout
    bad = run_driver("--dry-run", "trainer.eval_intervall=3")
    assert bad.returncode == 2 and "trainer.eval_interval" in bad.stderr
    missing = run_driver("--dry-run", "--config", "configs/nope.yaml")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_an_unknown_environment_is_named_with_the_known_ones():
    out = run_driver("--dry-run", "environment.env_class=maze_2d/medium")
    assert out.returncode == 2 and "environment.env_class" in out.stderr and "maze_2d/easy" in out.stderr


def test_every_unsupported_skyrl_key_is_refused_with_its_reason_and_documented():
    from settings.skyrl import UNSUPPORTED
    docs = (ROOT / "docs" / "configuration.md").read_text()
    for key, why in UNSUPPORTED.items():
        assert f"`{key}`" in docs, key
        with pytest.raises(ConfigError, match="does not support") as e:
            load_config(None, [f"{key}=1"])
        assert why in str(e.value)
    # and the table lists no key that runs: each key in it is one the loader refuses
    table = docs[docs.index("| keys | why |"):].split("\n\n")[0]
    listed = set(re.findall(r"`([a-z_.]+)`", table))
    assert listed <= set(UNSUPPORTED), sorted(listed - set(UNSUPPORTED))


def test_serve_arguments_are_typed_and_typos_named():
    """`serve run serve_app:app key=value`: strings become each setting's type through the same
    loader as the training config; a typo or a wrong type is named, with the fix."""
    from serving.settings import ServeSettings
    s = ServeSettings.from_args({"max_loras": "2", "num_gpus": "0.5", "base_model": "s3://b/models/maze-vl/"})
    assert (s.max_loras, s.num_gpus, s.base_id) == (2, 0.5, "maze-vl")
    with pytest.raises(ValueError, match="unknown serve argument 'max_lora'; did you mean 'max_loras'"):
        ServeSettings.from_args({"max_lora": "2"})
    with pytest.raises(ValueError, match="serve argument 'max_loras' expects int, got 'two'"):
        ServeSettings.from_args({"max_loras": "two"})
    with pytest.raises(ValueError, match="backend' must be hf or vllm"):
        ServeSettings.from_args({"backend": "tgi"})


def test_an_hf_replica_asks_for_a_gpu_where_it_must_run_on_one():
    """Ray hides every GPU from an actor that asks for none: device=cuda (or auto on a cluster with
    GPUs) gives each hf replica one GPU unless num_gpus says otherwise; the CPU asks for none."""
    from serve_app import app
    options = {d: app({"device": d})._bound_deployment.ray_actor_options for d in ("cpu", "cuda", "auto")}
    assert options["cpu"]["num_gpus"] == 0 and options["cuda"]["num_gpus"] == 1
    assert options["auto"]["num_gpus"] == 0  # no Ray cluster with GPUs here
    assert app({"device": "cuda", "num_gpus": "0.5"})._bound_deployment.ray_actor_options["num_gpus"] == 0.5


def test_every_key_the_configuration_page_names_exists():
    """docs/configuration.md names only keys the schema has (or refuses, in its SkyRL table): a renamed
    or removed key fails here instead of leaving the page wrong."""
    from settings.load import VALID_KEYS
    from settings.skyrl import UNSUPPORTED
    docs = (ROOT / "docs" / "configuration.md").read_text()
    named = set(re.findall(r"`((?:trainer|generator|environment|data|ray|s3)\.[A-Za-z0-9_.]+)", docs))
    free_form = [k for k, t in VALID_KEYS.items() if str(t).startswith("Dict")]
    sections = {v.rsplit(".", i)[0] for v in VALID_KEYS for i in range(1, v.count(".") + 1)}
    unknown = sorted(k for k in named if k not in VALID_KEYS and k not in UNSUPPORTED and k not in sections
                     and not any(k.startswith(f + ".") for f in free_form))
    assert named and not unknown, unknown


def test_overrides_after_an_option_of_several_values_reach_the_config():
    """`python bench/gpu_scale.py --workloads decode trainer.seed=3`: argparse alone gives the override
    to --workloads and refuses it; the benches' parsing hands every key=value to the config instead."""
    import argparse

    from settings.load import parse_with_overrides
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", nargs="+", choices=["short", "decode"])
    ap.add_argument("--keep-model", action="store_true")
    ap.add_argument("--out", default="runs/x")
    ap.add_argument("overrides", nargs="*")
    argv = ["--workloads", "decode", "trainer.seed=3", "--keep-model", "--out=runs/y", "data.train_size=32"]
    with pytest.raises(SystemExit):
        ap.parse_args(argv)
    args = parse_with_overrides(ap, argv)
    assert (args.workloads, args.keep_model, args.out) == (["decode"], True, "runs/y")
    assert args.overrides == ["trainer.seed=3", "data.train_size=32"]
    load_config(None, args.overrides)  # and they are the config's keys
