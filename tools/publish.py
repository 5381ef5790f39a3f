"""Publish a run's adapter for serving: `<prefix>/<name>/` with the adapter files and provenance.json,
which is what the serve app's and ray.serve.llm's `dynamic_lora_loading_path` reads (`<base_id>:<name>`).

    python tools/publish.py NAME [--config FILE] [--step best|final|N] [--to PREFIX] [--force] [key=value ...]

The run is the one the config (and overrides) names, as `driver.py` takes them: its exports
(`trainer.export_path`), metrics and recorded config. `--step best` (the default) is the adapter the
validation set chose, or the last export of a run without one; `final` the last export; N export step
N. The prefix is `--to` or `trainer.publish_path` (a folder, a shared folder or s3://bucket/prefix).
Readers never see half an adapter; a name already published, an adapter of another base, or a prefix
serving another base is refused with exit status 2 and nothing written (storage.adapters.publish).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from a checkout
from settings import Config, ConfigError, load_config, to_yaml  # noqa: E402
from settings.load import refuse_placeholder  # noqa: E402
from storage import adapters  # noqa: E402
from telemetry.run_log import read_metrics  # noqa: E402


def choose(cfg: Config, which: str) -> tuple[str, int, dict | None]:
    """(the adapter folder, its step, the validation's selection if it chose it) that `which` names."""
    t = cfg.trainer
    steps = adapters.exported_steps(t.export_path, cfg.s3)
    best = adapters.exported_best(t.export_path, cfg.s3) if which == "best" else None
    if best is not None:
        return f"{t.export_path}/best/policy", best["step"], best
    if which not in ("best", "final") and not which.isdigit():
        raise ConfigError(f"--step takes best, final or a step number, not '{which}'")
    step = int(which) if which.isdigit() else (steps[-1] if steps else None)
    if step not in steps:
        raise adapters.AdapterError(f"--step {which}: {t.export_path} holds no export of step {step} (it holds "
                                    f"{', '.join(map(str, steps)) or 'none'}); train first or name an exported step")
    return f"{t.export_path}/global_step_{step}/policy", step, None


def provenance(cfg: Config, source: str, step: int, best: dict | None, which: str) -> dict:
    """The run, the step, its scores, the base model and the run config's hash."""
    t = cfg.trainer
    scores = {h["step"]: h["eval/all/avg_score"] for h in read_metrics(Path(t.run_dir)) if "eval/all/avg_score" in h}
    recorded = Path(t.run_dir) / "config.yaml"
    config_text = recorded.read_text() if recorded.is_file() else to_yaml(cfg)
    return {"run": t.run_name, "run_dir": t.run_dir, "step": step, "chosen_by": "validation" if best else which,
            "eval_score": (best or {}).get("eval", scores.get(step)), "validation_score": (best or {}).get("validation"),
            "base_model": t.policy.model.path, "source": source,
            "config_sha256": hashlib.sha256(config_text.encode()).hexdigest(),
            "published_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", help="the adapter's name: clients ask for <base_id>:NAME")
    ap.add_argument("--config", help="the run's YAML config (default: configs/default.yaml)")
    ap.add_argument("--step", default="best", metavar="best|final|N")
    ap.add_argument("--to", metavar="PREFIX", help="the serving prefix (default: trainer.publish_path)")
    ap.add_argument("--force", action="store_true", help="replace an adapter published under that name")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, as driver.py takes them")
    args = ap.parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        prefix = args.to or cfg.trainer.publish_path
        if not prefix:
            raise ConfigError("a serving prefix is needed: --to s3://bucket/lora-adapters (or a folder), or set "
                              "trainer.publish_path")
        refuse_placeholder("--to" if args.to else "trainer.publish_path", prefix)
        source, step, best = choose(cfg, args.step)
        record = provenance(cfg, source, step, best, args.step)
        where = adapters.publish(source, prefix, args.name, record, args.force, cfg.s3)
    except (ConfigError, adapters.AdapterError) as e:
        print(f"publish error: {e}", file=sys.stderr)
        return 2
    print(f"published step {step} of {cfg.trainer.run_name} as {where} (serve it as <base_id>:{args.name})")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
