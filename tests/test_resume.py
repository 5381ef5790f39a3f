"""Resume and recovery through the real driver: a stopped-and-resumed run equals an uninterrupted
one; killed actors (SIGKILL and ray.kill) are rebuilt and the run finishes."""
import json

from safetensors.torch import load_file

from tests.test_e2e import run_driver, tiny_run_args

VOLATILE = ("timing/", "time", "ckpt/", "sync/adapter_load_s", "generate/tokens_per_s", "generate/episodes_per_min",
            "recovery/")


def tiny(model_dir, run):
    """The e2e run, four steps long, evaluated and checkpointed every second step (later keys win)."""
    return tiny_run_args(model_dir, run) + ["data.train_size=8", "trainer.hf_save_interval=100",
                                            "trainer.eval_interval=2", "trainer.ckpt_interval=2",
                                            "generator.sampling_params.temperature=1.5"]


def stable(history):
    return [{k: v for k, v in h.items() if not k.startswith(VOLATILE)} for h in history]


def read(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_stopped_and_resumed_run_equals_an_uninterrupted_one(tiny_model_dir, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert run_driver(tiny(tiny_model_dir, whole)).returncode == 0
    first = run_driver(tiny(tiny_model_dir, parts) + ["trainer.stop_after_step=2"])
    assert first.returncode == 0 and "stopping after step 2" in first.stderr + first.stdout
    second = run_driver(tiny(tiny_model_dir, parts))
    assert second.returncode == 0, second.stderr[-2000:]
    assert "resumed from" in second.stdout and "at step 2" in second.stdout
    a, b = stable(read(whole)), stable(read(parts))
    assert [h["step"] for h in a] == [h["step"] for h in b] == [0, 1, 2, 3, 4]
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert abs(x[k] - y[k]) <= 1e-4 * max(1.0, abs(x[k])), (x["step"], k, x[k], y[k])
    wa = load_file(str(whole / "ckpts" / "global_step_4" / "policy" / "adapter_model.safetensors"))
    wb = load_file(str(parts / "ckpts" / "global_step_4" / "policy" / "adapter_model.safetensors"))
    assert all((wa[k] - wb[k]).abs().max() < 1e-5 for k in wa)
    done = run_driver(tiny(tiny_model_dir, parts))
    assert done.returncode == 0 and "is complete" in done.stdout


def test_killed_actors_are_rebuilt_and_the_run_finishes(tiny_model_dir, tmp_path):
    run = tmp_path / "chaos"
    out = run_driver(tiny(tiny_model_dir, run) + ["--chaos-kill-every", "2", "--chaos-method", "mixed",
                                                  "data.train_size=12", "trainer.ckpt_interval=3"])
    assert out.returncode == 0, out.stderr[-3000:]
    kills = [json.loads(line) for line in (run / "chaos.jsonl").read_text().splitlines()]
    recoveries = [json.loads(line) for line in (run / "recoveries.jsonl").read_text().splitlines()]
    assert [k["method"] for k in kills] == ["sigkill", "ray_kill"] and [k["after_step"] for k in kills] == [2, 4]
    # the Checkpointer dies after step 2, so the save of step 3 fails: steps 1-3 are redone from step 0
    assert [(r["resumed_from"], r["steps_lost"]) for r in recoveries] == [(0, 3), (3, 1)]
    steps = [h["step"] for h in read(run)]
    assert steps == [0, 1, 2, 3, 4, 5, 6]  # no gap, no repeat
    assert "RECOVERY" in out.stdout
