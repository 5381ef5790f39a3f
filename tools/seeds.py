"""Several seeds of one config, one command: each seed is a real `python driver.py` run in its own
run folder; then a table per seed and mean +- std (base, best and final eval solve rate, wall
time; with a validation set, the eval solve rate of the adapter it chose) and seeds.png with one
eval curve a seed.

    python tools/seeds.py --seeds 0 1 2 [--parallel 1] [--name default] [--runs runs/seeds] [--config FILE]
                          [--heldout runs/heldout/eval.jsonl ...] [--no-run] [key=value ...]

Sequential by default (the 2-core CPU has room for one run); `--parallel K` runs K at once where a
GPU has room. Each seed writes runs/seeds/<name>/seed_<S>/ (metrics.jsonl, eval/, ...); running
the command again resumes each seed from its last checkpoint (a finished seed stops at once), and
the wall time adds up its invocations. Stopping the command (Ctrl-C, SIGTERM) stops the seeds' runs,
each saving its state as on a preemption. `--heldout FILE` also evaluates each seed's final adapter
(and the one its validation set chose) on another eval set (greedy, `driver.py --eval-only`; not
counted in the wall time); given again, on each set it names (columns held-out, held-out 2, ...);
`--no-run` only reports on the seeds' folders. Solve rates are split by the mazes' optimal route
length. `{seed}` in an override stands for the seed: a curriculum's later stage starts each seed from
that seed's own earlier stage, e.g.
`trainer.policy.model.lora.init_from=runs/seeds/easy/seed_{seed}/exports/global_step_64/policy`.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


_runs: set[subprocess.Popen] = set()  # the driver.py processes running now, stopped with this command
_runs_lock = threading.Lock()
_stopping = threading.Event()


def driver(args: list[str], log: Path) -> int:
    with open(log, "a") as out, _runs_lock:
        if _stopping.is_set():
            return -signal.SIGTERM
        proc = subprocess.Popen([sys.executable, "driver.py", *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "disabled")})
        _runs.add(proc)
    try:
        return proc.wait()
    finally:
        with _runs_lock:
            _runs.discard(proc)


def stop_runs(grace_s: float = 90.0) -> None:
    """Stop every running driver.py: left running, a seed's run would go on writing checkpoints into its
    folder after this command was stopped (and a moved folder's next run would resume from them).
    SIGTERM first (the run saves its state as on a preemption, within trainer.preemption_timeout_s),
    SIGKILL after grace_s."""
    with _runs_lock:
        _stopping.set()
        running = list(_runs)
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in running:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def by_length(per_maze: list[dict]) -> str:
    """'12: 49/50, 16: 9/14': solved/total by optimal route length."""
    lengths = sorted({m["optimal_moves"] for m in per_maze})
    return ", ".join(f"{n}: {sum(m['solved'] for m in per_maze if m['optimal_moves'] == n)}/"
                     f"{sum(m['optimal_moves'] == n for m in per_maze)}" for n in lengths)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def seed_args(seed: int, folder: Path, config: str | None, overrides: list[str]) -> list[str]:
    """driver.py's arguments for one seed, everything it writes inside its folder."""
    return ([f"--config={config}"] if config else []) + [o.replace("{seed}", str(seed)) for o in overrides] + [
        f"trainer.seed={seed}", f"trainer.run_dir={folder}", f"trainer.ckpt_path={folder}/ckpts",
        f"trainer.export_path={folder}/exports", f"data.dataset_dir={folder}/data"]


def eval_adapter(args: list[str], adapter: Path, eval_set: str | Path, out: Path, log: Path) -> list[dict]:
    """Greedy eval of an adapter on an eval .jsonl (`driver.py --eval-only`): one row a maze."""
    if driver(args + ["--eval-only", f"--eval-set={Path(eval_set).resolve()}", f"--adapter={adapter}",
                      f"trainer.run_dir={out}"], log):
        raise SystemExit(f"the eval of {adapter} on {eval_set} failed; see {log}")
    return read_jsonl(out / "eval_only.jsonl")


def heldout_key(i: int) -> str:
    """The result key (and run subfolder) of the i-th held-out set: heldout, heldout2, heldout3, ..."""
    return "heldout" if i == 0 else f"heldout{i + 1}"


def run_seed(seed: int, folder: Path, config: str | None, overrides: list[str], heldout: list[str] = (),
             run: bool = True) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    args = seed_args(seed, folder, config, overrides)
    code = 0
    if run:
        started = time.time()
        code = driver(args, folder / "driver.log")
        with open(folder / "wall_s.txt", "a") as f:  # a resumed seed adds up its invocations
            f.write(f"{time.time() - started:.1f}\n")
    wall = sum(float(x) for x in (folder / "wall_s.txt").read_text().split())
    history = read_jsonl(folder / "metrics.jsonl")
    evals = [(h["step"], h["eval/all/avg_score"]) for h in history if "eval/all/avg_score" in h]
    if code != 0 or not evals:
        raise SystemExit(f"seed {seed} failed (exit {code}); see {folder / 'driver.log'}")
    best = max(evals, key=lambda p: (p[1], -p[0]))
    step_s = sum(h.get("timing/step", 0.0) for h in history)
    result = {"seed": seed, "base": evals[0][1], "best": best[1], "best_step": best[0], "final": evals[-1][1],
              "final_step": evals[-1][0], "curve": evals, "wall_s": wall, "step_s": step_s,
              "final_by_length": by_length(read_jsonl(folder / "eval" / f"step_{evals[-1][0]:05d}.jsonl"))}
    from telemetry.curve import chosen_step
    chosen = chosen_step(history)
    if chosen is not None:
        result |= {"chosen": dict(evals)[chosen], "chosen_step": chosen,
                   "chosen_by_length": by_length(read_jsonl(folder / "eval" / f"step_{chosen:05d}.jsonl"))}
    if heldout:
        final = max((folder / "adapters").glob("v*"), key=lambda p: int(p.name[1:]))
        result["heldout_adapter"] = final.name
    for i, eval_set in enumerate(heldout):
        name = heldout_key(i)
        adapters = {name: final} | ({f"{name}_chosen": folder / "exports" / "best" / "policy"} if chosen else {})
        for key, adapter in adapters.items():
            per_maze = eval_adapter(args, adapter, eval_set, folder / key, folder / f"{key}.log")
            result |= {key: sum(m["solved"] for m in per_maze) / len(per_maze), f"{key}_by_length": by_length(per_maze)}
    return result


def plot(results: list[dict], out: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    for r in results:
        line, = ax.plot(*zip(*r["curve"]), "o-", ms=3, label=f"seed {r['seed']}: final {100 * r['final']:.1f}%")
        if "chosen" in r:  # the adapter its validation set chose
            ax.plot(r["chosen_step"], r["chosen"], "*", ms=11, color=line.get_color())
    ax.axhline(0.9, color="grey", ls=":", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("eval solve rate (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options, and the key=value overrides wherever they stand: right after `--seeds 0 1 2`,
    argparse would read them as more seeds and refuse them."""
    from settings.load import parse_with_overrides
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--name", default="default", help="the seeds' folders go to <runs>/<name>/")
    ap.add_argument("--runs", type=Path, default=ROOT / "runs" / "seeds", help="default runs/seeds")
    ap.add_argument("--config")
    ap.add_argument("--heldout", metavar="FILE", action="append", default=[],
                    help="also evaluate each seed's final adapter on this eval .jsonl (may be given again)")
    ap.add_argument("--no-run", action="store_true", help="only report on the seeds' run folders")
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    return parse_with_overrides(ap, argv)


def main():
    args = parse_args(sys.argv[1:])
    base = args.runs / args.name
    missing = [s for s in args.seeds if args.no_run and not (base / f"seed_{s}" / "wall_s.txt").exists()]
    if missing:
        raise SystemExit(f"--no-run reports on finished runs, and {base} holds none for seed(s) "
                         f"{', '.join(map(str, missing))}: run the same command without --no-run first")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped like Ctrl-C: the runs stop with it
    with ThreadPoolExecutor(args.parallel) as pool:
        try:
            results = list(pool.map(lambda s: run_seed(s, base / f"seed_{s}", args.config, args.overrides,
                                                       args.heldout, not args.no_run), args.seeds))
        except KeyboardInterrupt:
            pool.shutdown(wait=False, cancel_futures=True)
            stop_runs()
            raise SystemExit("stopped, and the seeds' runs with it; the same command resumes each from its saved state")
    # (title, the result's key, its route-length split): columns a seed has only with a validation set
    # (chosen) or --heldout are printed when every seed has them
    columns = [("base", "base", None), ("best (step)", "best", None), ("final (step)", "final", "final_by_length"),
               ("chosen by validation (step)", "chosen", "chosen_by_length")]
    for i in range(len(args.heldout)):
        title, key = f"held-out{f' {i + 1}' if i else ''}", heldout_key(i)
        columns += [(f"{title}, final adapter", key, f"{key}_by_length"),
                    (f"{title}, chosen adapter", f"{key}_chosen", f"{key}_chosen_by_length")]
    columns = [c for c in columns if all(c[1] in r for r in results)]
    steps = {"best": "best_step", "final": "final_step", "chosen": "chosen_step"}

    def cell(r, key, split):
        step = f" ({r[steps[key]]})" if key in steps else ""
        return f"{100 * r[key]:.1f}%{step}" + (f", {r[split]}" if split else "")
    print("| seed | " + " | ".join(title for title, _, _ in columns) + " | wall |   "
          + f"({args.name}: {' '.join(args.overrides) or 'as configured'})")
    print("|---" * (len(columns) + 2) + "|")
    for r in results:
        print(f"| {r['seed']} | " + " | ".join(cell(r, k, split) for _, k, split in columns)
              + f" | {r['wall_s'] / 60:.1f} min |")
    cols = {k: np.array([r[k] for r in results]) for _, k, _ in columns}
    print("| mean +- std | " + " | ".join(f"{100 * cols[k].mean():.1f} +- {100 * cols[k].std():.1f}%"
                                          for _, k, _ in columns)
          + f" | {np.mean([r['wall_s'] for r in results]) / 60:.1f} +- "
            f"{np.std([r['wall_s'] for r in results]) / 60:.1f} min |")
    plot(results, base / "seeds.png", f"{args.name}: final {100 * cols['final'].mean():.1f} +- "
                                      f"{100 * cols['final'].std():.1f}% over seeds {args.seeds}")
    (base / "seeds.json").write_text(json.dumps(results, indent=2))
    print(f"curves: {base / 'seeds.png'}")


if __name__ == "__main__":
    main()
