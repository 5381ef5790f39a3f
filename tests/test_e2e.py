"""Two GRPO steps of the real pipeline, through real Ray actors, on a tiny model."""
import json

import pytest

from tests.helpers import run_driver, tiny_run_args

pytestmark = pytest.mark.slow  # a system test: see setup.cfg's markers


def test_two_grpo_steps_through_ray_actors(tiny_model_dir, tiny_run):
    run, out = tiny_run
    assert out.returncode == 0, out.stderr[-3000:]
    history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [0, 1, 2]
    last = history[-1]
    for key in ("policy/policy_loss", "policy/grad_norm", "policy/policy_kl", "reward/avg_raw_reward",
                "generate/avg_num_tokens", "timing/generate", "timing/train", "timing/ref", "timing/sync",
                "eval/all/avg_score", "sync/adapter_version"):
        assert key in last, key
    # a step is (train_batch_size / policy_mini_batch_size) optimizer steps per update epoch
    from settings import load_config
    t = load_config(None, tiny_run_args(tiny_model_dir, run)).trainer
    per_step = t.train_batch_size // t.policy_mini_batch_size * t.update_epochs_per_batch
    assert last["sync/adapter_version"] == 2 and last["policy/optimizer_steps"] == per_step
    assert (run / "learning_curve.png").stat().st_size > 1000
    assert "solve rate: baseline" in out.stdout
    assert list((run / "tensorboard").glob("events.*"))
    # each evaluation's per-maze file carries the step its metrics were logged at
    evaluated = [h["step"] for h in history if "eval/all/avg_score" in h]
    assert sorted(p.name for p in (run / "eval").glob("step_*.jsonl")) == [f"step_{s:05d}.jsonl" for s in evaluated]
    # the validation set chose the first adapter that no later one beat, exported with its scores
    scores = [(h["step"], h["eval/validation/avg_score"]) for h in history if "eval/validation/avg_score" in h]
    assert [s for s, _ in scores] == [1, 2]
    chosen = max(scores, key=lambda p: (p[1], -p[0]))
    selection = json.loads((run / "exports" / "best" / "selection.json").read_text())
    assert (selection["step"], selection["validation"]) == chosen and history[-1]["eval/validation/best_step"] == chosen[0]
    assert selection["eval"] == next(h["eval/all/avg_score"] for h in history if h["step"] == chosen[0])
    assert f"chosen by validation: step {chosen[0]}" in out.stdout
    assert sorted(p.name for p in (run / "validation").glob("step_*.jsonl")) == ["step_00001.jsonl", "step_00002.jsonl"]
    # the exported adapter is a PEFT adapter that peft itself loads
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText
    export = run / "exports" / "global_step_2" / "policy"
    base = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    model = PeftModel.from_pretrained(base, str(export))
    assert any("lora_A" in n for n, _ in model.named_parameters())
    assert (run / "exports" / "best" / "policy" / "adapter_model.safetensors").read_bytes() == \
        (run / "exports" / f"global_step_{chosen[0]}" / "policy" / "adapter_model.safetensors").read_bytes()
    cfg = json.loads((export / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["base_model_name_or_path"] == tiny_model_dir


def test_separate_reference_shards_when_not_from_the_policy_base(tiny_model_dir, tmp_path, monkeypatch):
    """trainer.ref.from_policy_base=false: the KL term's reference comes from SkyRL's separate
    RefShards (by default the policy shards score it with the adapter off and none is placed); a
    step times and logs its ref phase and KL either way."""
    run = tmp_path / "run"
    args = tiny_run_args(tiny_model_dir, run) + ["trainer.ref.from_policy_base=false", "data.train_size=2",
                                                 "trainer.eval_before_train=false", "trainer.logger=mlflow"]
    plan = run_driver(["--dry-run", *args])
    assert "1 policy shards, 1 ref shards, 1 engines" in plan.stdout, plan.stdout + plan.stderr[-2000:]
    default = run_driver(["--dry-run", *tiny_run_args(tiny_model_dir, run)])
    assert "1 policy shards, 0 ref shards, 1 engines" in default.stdout, default.stdout + default.stderr[-2000:]
    out = run_driver(args)
    assert out.returncode == 0, out.stderr[-3000:]
    last = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert last["step"] == 1 and "timing/ref" in last and "policy/policy_kl" in last
    # trainer.logger=mlflow: the same step's numbers in the run folder's MLflow store
    from mlflow.tracking import MlflowClient
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the driver chose the run folder's file store
    client = MlflowClient(tracking_uri=(run / "mlruns").resolve().as_uri())
    [logged] = client.search_runs([client.get_experiment_by_name("visrl").experiment_id])
    assert logged.data.metrics["policy/policy_kl"] == last["policy/policy_kl"]
    assert logged.data.params["trainer.ref.from_policy_base"] == "False"
