"""visrl driver: multi-turn GRPO for a vision-language maze agent, on Ray.

    python driver.py [--config FILE] [key=value ...]         train (default: the embedded CPU run)
    python driver.py --dry-run [key=value ...]               validate; print config and placement
    python driver.py --make-dataset DIR [key=value ...]      write train/eval sets + manifest
    python driver.py --eval-only [--adapter DIR|s3://...]    greedy eval of a model (+ adapter)

One step (`grpo_step` below), as docs/design.md draws it:
    rollouts (VLLMEngine x N, EnvPool) -> group-relative advantages (GRPO)
      -> LoRA update on the frozen base (FSDPPolicyShard x N, RefShard x N for the KL term)
      -> adapter written to shared storage, engines load the new version
      -> periodic eval (the fixed eval mazes), exports and checkpoints (local folder or s3://)
      -> with a validation set: the adapter that scores best on it exported as <export_path>/best

What is simplified: the trainer scores each turn's tokens with the prompt that turn was sampled
from (turns merge into one sequence only when the context window keeps the whole history), and
old log-probs come from the engines unless `trainer.algorithm.use_rollout_logprobs=false`.
Everything about the actors' lives (start, recovery, chaos, restore) is controller/fleet.py; the
state a step changes is rl/state.py's RunState, written only by this loop.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rl.inputs import InputError, check_environment
from settings import Config, ConfigError, load_config, to_yaml


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="YAML config (default: configs/default.yaml)")
    ap.add_argument("--dry-run", action="store_true", help="validate, print the resolved config and placement, exit")
    ap.add_argument("--make-dataset", metavar="DIR", help="write train.jsonl, eval.jsonl, manifest.json to DIR")
    ap.add_argument("--eval-only", action="store_true", help="evaluate greedily on the eval set and exit")
    ap.add_argument("--eval-set", metavar="FILE", help="with --eval-only: another eval .jsonl")
    ap.add_argument("--adapter", metavar="DIR", help="with --eval-only: a LoRA adapter folder or s3:// prefix")
    ap.add_argument("--chaos-kill-every", type=int, default=0, metavar="N",
                    help="kill a random actor every N steps (tests your recovery set-up; see docs/fault-tolerance.md)")
    ap.add_argument("--chaos-method", choices=("sigkill", "ray_kill", "mixed"), default="sigkill",
                    help="how --chaos-kill-every kills: SIGKILL of the actor's process, ray.kill, or alternating")
    ap.add_argument("--chaos-in-recovery", action="store_true",
                    help="also kill the EnvPool while the first recovery rebuilds the actors (a second fault)")
    ap.add_argument("--chaos-kill-node", action="append", default=[], metavar="PHASE@STEP",
                    help="kill a worker node (its raylet and every process on it) during PHASE of STEP, e.g. train@5 "
                         "(SIGKILL, a power cut), train@5:sigterm (a pod deletion) or train@5:drain (a pod deletion "
                         "whose preStop hook asks for a checkpoint first); repeatable (a multi-node "
                         "cluster; docs/fault-tolerance.md)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.train_batch_size=24")
    return ap.parse_intermixed_args(argv)


@dataclass(frozen=True)
class Run:
    """What stays fixed from step to step."""
    cfg: Config
    dir: Path
    eval_rows: list
    validation_rows: list     # empty: no validation set, the final adapter is the run's
    total_steps: int
    config_yaml: str

    @property
    def id(self) -> str:
        """The run's name on the cluster: its own Ray namespace (controller.runtime_env.run_namespace)."""
        return self.cfg.ray.namespace


def grpo_step(step: int, state, fleet, run: Run, preemption) -> dict:
    """One GRPO step, top to bottom (state: rl.state.RunState, fleet: controller.fleet.Fleet,
    preemption: controller.preemption.Preemption). Each phase is timed into timing/<phase>; the
    metrics of the step come back."""
    from rl.algorithm import compute_advantages
    from rl.batch import build_items
    from rl.metrics import rollout_metrics
    from storage import adapters
    from telemetry.run_log import log_line
    from telemetry.timing import Phases

    cfg = run.cfg
    t, a, g = cfg.trainer, cfg.trainer.algorithm, cfg.generator
    temperature = g.sampling_params.temperature
    def on_phase(phase: str) -> None:
        fleet.chaos_at_phase(step, phase)
        preemption.at_phase(phase)  # SIGTERM before the update: the step is abandoned here
    phases = Phases(on_enter=on_phase)

    # 1-2. rollouts: the next batch of prompts (one maze each) in the dataloader's seeded order, played
    #    turn by turn (every live episode of a turn goes to the engines in one call, then the env pool
    #    steps); one-step-off (trainer.fully_async), generated while the last step trained
    episodes, epoch, generated = fleet.rollouts.take(step, state, phases, preemption)

    # 3. advantages: each episode's score against its group's (the samples of the same maze); one
    #    value a turn, so an estimator with step-level credit (gigpo) can tell the turns apart
    with phases("advantages"):
        advantages = compute_advantages(a, episodes)  # per episode, one value a turn
    metrics = (rollout_metrics(episodes, advantages, generated["seconds"]) | generated["metrics"]
               | {"data/replayed": state.sampler.replayed})

    # 4. training items: sequences with loss masks, per-token loss weights, mini-batches of prompts
    with phases("items"):
        items = build_items(episodes, advantages, t.policy_mini_batch_size, a.loss_reduction,
                            drop_zero_advantage=a.filter_zero_advantage_groups)
    metrics |= {"train/sequences": len(items), "train/tokens": sum(len(it.seq.input_ids) for it in items)}

    if fleet.takes_turns:  # the update and the sync need the shards' weights, the engines' memory free
        with phases("sleep"):
            fleet.turn_to_trainer()

    if items:  # a batch whose groups all scored alike carries no gradient
        # 5. reference log-probs for the KL term: each rank's share goes to the object store once, and
        #    the ref shards' results stay there for the policy shards
        with phases("ref"):
            shares = fleet.trainer.share(items)
            ref_logprobs = fleet.trainer.reference_logprobs(shares, temperature, t.micro_forward_batch_size_per_gpu)
            fleet.trainer.wait(ref_logprobs)

        # 6. update: the LoRA on every policy shard (mini-batches, micro-batches, update epochs)
        with phases("train"):
            result = fleet.trainer.train(shares, a, temperature, t.micro_train_batch_size_per_gpu,
                                         t.update_epochs_per_batch, ref_logprobs)
        metrics |= {k if k.startswith("comm/") else f"policy/{k}": v for k, v in result.items()}

    # 7. weight sync: adapter v+1 written atomically to shared storage; the engines load it now, or
    #    one-step-off, as the next batch starts
    with phases("sync"):
        adapter = adapters.version_ref(run.dir / "adapters", state.version + 1)
        fleet.trainer.save_adapter(adapter.path)
    metrics |= fleet.rollouts.publish(adapter, phases)
    adapters.prune_versions(run.dir / "adapters", keep=2, current=adapter.version)
    status = fleet.engines.status()
    metrics |= {"sync/adapter_version": adapter.version,
                "sync/adapter_load_s": max(s["last_adapter_load_s"] for s in status)}
    for when in ("awake", "asleep"):  # on a GPU: what the engines hold, and what sleep leaves them
        held = [s[f"memory_{when}_gib"] for s in status if s.get(f"memory_{when}_gib") is not None]
        if held:
            metrics[f"memory/engine_{when}_gib"] = max(held)
    state.step, state.adapter = step, adapter  # the one place a step is marked done

    # 8. eval, export, checkpoint (preempted or a node draining: the checkpoint only, unless it is the last step)
    last = step == run.total_steps or step == t.stop_after_step
    preempted = preemption.save_now
    if (step % t.eval_interval == 0 and not preempted) or last:
        with phases("eval"):
            metrics |= evaluate_policy(run, fleet, state)
        if run.validation_rows:
            with phases("validation"):
                metrics |= choose_adapter(run, fleet, state, metrics["eval/all/avg_score"])
    if (step % t.hf_save_interval == 0 and not preempted) or last:
        with phases("export"):
            adapters.export(state.adapter, t.export_path, step, cfg.s3)
    metrics |= {"epoch": epoch, "run/steps_left": run.total_steps - step}  # 0 at the end: a finished run, not a dead one
    if step % t.ckpt_interval == 0 or last or fleet.save_failed or preempted:
        with phases("ckpt"):  # the step's line so far goes with it: a run stopped before logging it gets it back
            metrics |= fleet.checkpoint(state, run.config_yaml, log_line(metrics | phases.metrics() | {"time": time.time()}))
    return metrics | phases.metrics() | fleet.peak_memory()


def evaluate_policy(run: Run, fleet, state) -> dict:
    """The eval set through the engines with the current adapter; one line a row to eval/step_N.jsonl."""
    from rl.evaluate import evaluate, evaluation_sampling
    from rl.metrics import eval_metrics
    fleet.rollouts.settle(state)  # one-step-off: the batch in flight done, the trainer's adapter loaded
    fleet.turn_to_engines()
    report = evaluate(fleet.runner, run.eval_rows, evaluation_sampling(run.cfg), state.version,
                      run.cfg.trainer.eval_batch_size)
    report.write(run.dir / "eval" / f"step_{state.step:05d}.jsonl")
    return eval_metrics(report)


def choose_adapter(run: Run, fleet, state, eval_score: float) -> dict:
    """Early stopping by a validation set the eval set never sees: the adapter that beats every earlier
    one there (strictly, so a tie keeps the earlier) is exported as <export_path>/best/policy, with
    selection.json beside it saying its step and scores. The eval set only reports."""
    from rl.evaluate import evaluate, evaluation_sampling
    from storage import adapters
    report = evaluate(fleet.runner, run.validation_rows, evaluation_sampling(run.cfg), state.version,
                      run.cfg.trainer.eval_batch_size)
    report.write(run.dir / "validation" / f"step_{state.step:05d}.jsonl")
    if state.best is None or report.solve_rate > state.best["validation"]:
        best = {"step": state.step, "validation": report.solve_rate, "eval": eval_score}
        adapters.export_best(state.adapter, run.cfg.trainer.export_path, best, run.cfg.s3)
        state.best = best
    return {"eval/validation/avg_score": report.solve_rate, "eval/validation/best_step": state.best["step"]}


def step_line(step: int, total: int, m: dict) -> str:
    solve = f" | eval solve {100 * m['eval/all/avg_score']:.1f}%" if "eval/all/avg_score" in m else ""
    return (f"step {step}/{total} | reward {m.get('reward/avg_raw_reward', 0):.3f}{solve} | "
            f"{m['timing/step']:.1f}s (gen {m.get('timing/generate', 0):.1f}s, train {m.get('timing/train', 0):.1f}s)")


def train(cfg: Config, chaos=None) -> int:
    """Set up, resume, fit, finish (`chaos`: controller.chaos.Chaos, the faults asked for on the
    command line)."""
    from controller import drain
    from controller.preemption import Preemption
    run, fleet, state, resume_at = set_up(cfg, chaos)
    preemption = Preemption(cfg.trainer.preemption_timeout_s, lambda: fleet.durable_step,
                            drains=lambda: drain.asked(run.id))
    preemption.install()
    drain.driver_started(run.id)  # from here a worker node's preStop hook gets a checkpoint before it goes
    try:
        log, pending = resume(run, fleet, state, resume_at)
        fit(run, fleet, state, log, pending, preemption)
        return finish(run, fleet, state, log, preemption)
    finally:
        fleet.rollouts.cancel()  # one-step-off: a batch still in flight stops at its next turn
        drain.driver_stopped(run.id)


def set_up(cfg: Config, chaos):
    """Check every input before anything starts, record the config, start the actors: (run, fleet,
    the run state at step 0, the checkpoint step to resume from)."""
    from actors.checkpointer import Checkpointer, resume_step
    from controller.fleet import Fleet
    from controller.runtime_env import connect, run_namespace
    from rl.inputs import check_model_path, check_prompt_fits, initial_adapter, load_datasets, load_validation, make_prompters
    from rl.sampler import PromptSampler, repeat_long_routes
    from rl.state import RunState
    from vlm.load import resolve_device, resolve_model_path
    from vlm.processor import load_processor

    t = cfg.trainer
    check_model_path(t.policy.model.path)
    start_from = initial_adapter(cfg)
    prompters = make_prompters(load_processor(resolve_model_path(t.policy.model.path, cfg.s3, weights=False)), cfg)
    check_prompt_fits(prompters, cfg)
    # which checkpoint to resume from, found before any actor starts (none that verifies: an error)
    resume_at = resume_step(Checkpointer(t.ckpt_path, cfg.s3), t.ckpt_path) if t.resume_mode == "latest" else None
    train_rows, eval_rows = load_datasets(cfg)
    cfg.ray.namespace = run_namespace(cfg.ray.namespace, t.run_name)  # before config.yaml records it
    sampler = PromptSampler(repeat_long_routes(train_rows, cfg.data.long_route_repeats), t.train_batch_size, t.seed,
                            cfg.data.replay_share)
    run = Run(cfg, Path(t.run_dir), eval_rows, load_validation(cfg), t.epochs * sampler.steps_per_epoch,
              to_yaml(cfg))
    run.dir.mkdir(parents=True, exist_ok=True)
    (run.dir / "config.yaml").write_text(run.config_yaml)
    if t.strategy == "fsdp":
        print("note: trainer.strategy=fsdp runs FSDP2 (fully_shard), as fsdp2 does; FSDP1 is not supported", flush=True)
    connect(cfg)
    fleet = Fleet(cfg, run.total_steps, run.dir, resolve_device(t.device), prompters, chaos, start_from)
    fleet.start()
    return run, fleet, RunState(0, None, sampler), resume_at


def resume(run: Run, fleet, state, resume_at: int | None):
    """The checkpoint (or the start) into the actors and `state`, the metrics log from that step on,
    and the step-0 eval of a fresh run: (log, metrics for the next step's line)."""
    from telemetry.run_log import RunLog
    t = run.cfg.trainer
    restore_s = fleet.restore(state, t.resume_mode, resume_at)
    if restore_s is not None:
        print(f"resumed from {t.ckpt_path if t.resume_mode == 'latest' else t.resume_path} at step {state.step} "
              f"(adapter v{state.version}) in {restore_s:.1f}s{state.in_flight_note()}", flush=True)
    log = RunLog(str(run.dir), keep_through_step=state.step if restore_s is not None else -1, logger=t.logger,
                 project=t.project_name, run_name=t.run_name, config=asdict(run.cfg), tracker_ids=state.trackers,
                 saved_line=state.saved_line if t.resume_mode == "latest" else None)  # this run's own checkpoint
    state.trackers = log.tracker_ids()  # kept with every checkpoint from here on
    if state.step >= run.total_steps:
        print(f"the run in {run.dir} is complete ({state.step}/{run.total_steps} steps); start another with "
              f"trainer.resume_mode=none or a new trainer.run_dir")
    elif t.eval_before_train and state.step == 0:
        log.log(0, evaluate_policy(run, fleet, state) | {"time": time.time()})
    return log, ({"ckpt/restore_s": restore_s} if restore_s is not None else {})


def fit(run: Run, fleet, state, log, pending: dict, preemption) -> None:
    """grpo_step until the last step (or trainer.stop_after_step, or SIGTERM); a lost actor or node is
    rebuilt and the run goes on from the newest checkpoint, its redone steps logged once."""
    from tqdm import tqdm

    from controller.preemption import Preempted
    t = run.cfg.trainer
    bar = tqdm(total=run.total_steps, initial=state.step, unit="step",
               desc=f"{t.algorithm.advantage_estimator} {t.project_name}/{t.run_name}")
    recovered = None  # the record of a recovery whose next step has not finished yet
    hinted = False  # the checkpoint interval's hint, after the first step (when a step's time is known)
    while state.step < run.total_steps and preemption.requested is None:
        step, started = state.step + 1, time.perf_counter()
        preemption.step_started()
        try:
            metrics = grpo_step(step, state, fleet, run, preemption)
        except Preempted:
            fleet.rollouts.rewind(state)  # the batch goes back: the rerun takes it again
            if preemption.requested is not None:
                bar.write(f"SIGTERM during step {step}, before its update: the step is abandoned")
                break
            bar.write(f"node(s) {', '.join(n[:8] for n in preemption.draining)} draining during step {step}, "
                      f"before its update: the step is abandoned, the state of step {state.step} saved")
            answer_drains(run, fleet, state, preemption)
            continue
        except Exception as failure:
            if not fleet.is_actor_failure(failure):
                raise
            recovered = fleet.recover(failure, state, step)  # rebuild the actors, reload the newest checkpoint
            log.rewind(state.step, state.saved_line)
            pending |= {"recovery/restarts": fleet.restarts, "recovery/steps_lost": recovered["steps_lost"]}
            bar.n = state.step
            bar.refresh()
            continue
        if recovered is not None:
            pending |= fleet.step_done_after_recovery(recovered)
            recovered = None
        metrics |= pending | {"timing/step": time.perf_counter() - started, "time": time.time()}
        pending = {}
        log.log(step, metrics)
        if preemption.draining:
            answer_drains(run, fleet, state, preemption)
        bar.update(1)
        bar.write(step_line(step, run.total_steps, metrics))
        if not hinted and (hint := fleet.interval_hint(metrics["timing/step"])):
            bar.write(hint)
        hinted = True
        if t.stop_after_step and step >= t.stop_after_step:
            bar.write(f"stopping after step {step} (trainer.stop_after_step); resume with trainer.resume_mode=latest")
            break
        if fleet.chaos.due(step, run.total_steps):
            fleet.chaos_kill(step)
    bar.close()


def answer_drains(run: Run, fleet, state, preemption) -> None:
    """The nodes asking to be drained learn which step is saved (saving it first where it is not), and
    go; the run goes on and their loss restores that step."""
    from controller import drain
    if fleet.durable_step != state.step:
        fleet.checkpoint(state, run.config_yaml)
    drain.answer(preemption.draining, fleet.durable_step, run.id)
    preemption.draining = []


def finish(run: Run, fleet, state, log, preemption) -> int:
    """The last save made durable, the learning curve drawn, the summary printed; the exit status
    (controller.preemption.PREEMPTED after SIGTERM, with the state saved)."""
    from controller.preemption import PREEMPTED
    from telemetry.curve import plot_learning_curve, summary_line
    if preemption.requested is not None and fleet.durable_step != state.step:
        fleet.checkpoint(state, run.config_yaml)  # an abandoned step: the state of the step before it
    code = fleet.make_last_save_durable(state, run.config_yaml)
    history = log.history()
    last_eval = next((h for h in reversed(history) if "eval/all/oracle_ceiling" in h), {})
    plot_learning_curve(history, str(run.dir / "learning_curve.png"), last_eval.get("eval/all/oracle_ceiling"),
                        last_eval.get("eval/all/env_ceiling"))
    log.close(run.dir / "learning_curve.png")
    if code == 0 and preemption.requested is not None:
        print(f"preempted: the state of step {state.step} is saved in {run.cfg.trainer.ckpt_path} "
              f"({time.monotonic() - preemption.requested:.1f}s after SIGTERM); run the same command to resume",
              flush=True)
        return PREEMPTED
    if code == 0:
        print(summary_line(history))
        print(f"run folder: {run.dir} (metrics.jsonl, tensorboard/, learning_curve.png, eval/)")
        if state.best is not None:
            print(f"adapter chosen by validation (step {state.best['step']}): {run.cfg.trainer.export_path}/best/policy")
    return code


def eval_only(cfg: Config, eval_set: str | None, adapter: str | None) -> int:
    """Greedy eval of the base or an adapter on the run's eval set, or on `eval_set` as it is: its rows'
    environment (another than the config's, say; several tasks are played as their mix and reported
    task by task) is the one played, and the run's dataset is not read."""
    from dataclasses import replace

    from actors.local import evaluate_locally
    from envs.mix import env_class_of
    from rl.inputs import adapter_folder, check_model_path, load_datasets, read_rows
    check_model_path(cfg.trainer.policy.model.path)
    adapter = adapter_folder(adapter, cfg.s3) if adapter else None
    if eval_set:
        eval_rows = read_rows(eval_set, "--eval-set", None)
        cfg = replace(cfg, environment=replace(cfg.environment, env_class=env_class_of(r["env_id"] for r in eval_rows)))
    else:
        _, eval_rows = load_datasets(cfg)
    report = evaluate_locally(cfg, eval_rows, adapter)
    out = Path(cfg.trainer.run_dir) / "eval_only.jsonl"
    report.write(out)
    print(f"{cfg.environment.env_class}, one line a row: {out}")
    print(json.dumps(report.summary()))
    print(report.line())
    return 0


def dry_run(cfg: Config) -> int:
    from placement.plan import format_plan, make_plan
    print(to_yaml(cfg))
    print(format_plan(make_plan(cfg, use_gpu=cfg.trainer.device == "cuda")))
    return 0


def make_dataset(cfg: Config, out_dir: str) -> int:
    from rl.inputs import write_run_dataset
    manifest = write_run_dataset(cfg, out_dir)
    print(json.dumps(manifest["splits"], indent=2))
    print(f"wrote {', '.join(str(Path(out_dir) / s['file']) for s in manifest['splits'].values())}, manifest.json")
    return 0


def chaos_from_args(args):
    from controller.chaos import Chaos, parse_node_kills
    try:
        node_kills, node_signals = parse_node_kills(args.chaos_kill_node)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return Chaos(args.chaos_kill_every, args.chaos_method, args.chaos_in_recovery, node_kills, node_signals=node_signals)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cfg = load_config(args.config, args.overrides)
        check_environment(cfg)
        if args.dry_run:
            return dry_run(cfg)
        if args.make_dataset:
            return make_dataset(cfg, args.make_dataset)
        if args.eval_only:
            return eval_only(cfg, args.eval_set, args.adapter)
        return train(cfg, chaos_from_args(args))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except InputError as e:
        print(f"input error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        from actors.checkpointer import CheckpointError
        from controller.fleet import GiveUp
        if not isinstance(e, (GiveUp, CheckpointError)):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
