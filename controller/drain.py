"""A worker node about to go asks the driver for a checkpoint first.

A pod deletion, a spot reclaim or a node drain sends SIGTERM to the worker's processes, then SIGKILL:
the policy shards on that node take their part of the optimizer with them, and the run would go back
to its last checkpoint (up to `trainer.ckpt_interval` steps). The worker pod's preStop hook runs
`python -m controller.drain` before the SIGTERM: it asks the driver through Ray's key-value store
and waits for the answer. The driver abandons a step that has not reached its update (or finishes
one that has), saves, and answers with the saved step; the hook returns, the node goes, and the
recovery restores that checkpoint: nothing is lost. Every visrl run on the cluster is asked and
waited for; the wait is bounded (`--timeout`), and without a run the hook returns at once.

    python -m controller.drain --timeout 100     # in the worker pod (deploy/kuberay/rayjob-train.yaml)
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

NAMESPACE = "visrl_drain"
# keys: running/<run> while a driver answers; ask/<node> while a node waits; done/<node>/<run> = the
# step that run saved for it. Every run on the cluster saves before the node goes (two jobs may share it).


def _kv():
    from ray.experimental import internal_kv
    return internal_kv


def _key(*parts: str) -> bytes:
    return "/".join(parts).encode()


def _runs() -> list[str]:
    return [k.decode()[len("running/"):] for k in _kv()._internal_kv_list(b"running/", namespace=NAMESPACE)]


def driver_started(run: str) -> None:
    _kv()._internal_kv_put(_key("running", run), b"1", overwrite=True, namespace=NAMESPACE)


def driver_stopped(run: str) -> None:
    _kv()._internal_kv_del(_key("running", run), namespace=NAMESPACE)


def asked(run: str) -> list[str]:
    """The nodes asking for a checkpoint that `run` has not answered yet (the driver's side)."""
    kv = _kv()
    nodes = [k.decode()[len("ask/"):] for k in kv._internal_kv_list(b"ask/", namespace=NAMESPACE)]
    return sorted(n for n in nodes if not kv._internal_kv_exists(_key("done", n, run), namespace=NAMESPACE))


def answer(nodes: list[str], step: int, run: str) -> None:
    """Tell each asking node that `run` has saved the state of `step`."""
    for node in nodes:
        _kv()._internal_kv_put(_key("done", node, run), str(step).encode(), overwrite=True, namespace=NAMESPACE)


def request(node: str, timeout_s: float, poll_s: float = 0.2) -> dict[str, int]:
    """Ask every running visrl run for a checkpoint on behalf of `node` and wait until each has
    answered, has ended, or timeout_s has passed: {run: the step it saved} ({} without a run)."""
    kv = _kv()
    for old in kv._internal_kv_list(_key("done", node, ""), namespace=NAMESPACE):  # a node id asks once
        kv._internal_kv_del(old, namespace=NAMESPACE)
    if not _runs():
        return {}
    kv._internal_kv_put(_key("ask", node), str(time.time()).encode(), overwrite=True, namespace=NAMESPACE)
    saved: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            running = _runs()
            for run in running:
                step = kv._internal_kv_get(_key("done", node, run), namespace=NAMESPACE)
                if step is not None:
                    saved[run] = int(step)
            if all(run in saved for run in running):  # every run still there has saved (or none is left)
                break
            time.sleep(poll_s)
    finally:
        kv._internal_kv_del(_key("ask", node), namespace=NAMESPACE)  # answered or given up: stop asking
    return saved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m controller.drain", description=__doc__.split("\n\n")[0])
    ap.add_argument("--timeout", type=float, default=100.0,
                    help="the longest this takes, reaching the cluster included (seconds); keep it under the "
                         "pod's terminationGracePeriodSeconds")
    ap.add_argument("--address", default="auto", help="the Ray cluster this node belongs to")
    args = ap.parse_args(argv)
    started, progress = time.monotonic(), {}

    def ask() -> None:
        import ray
        ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
        progress["node"] = ray.get_runtime_context().get_node_id()
        progress["saved"] = request(progress["node"], max(args.timeout - (time.monotonic() - started), 0.0))

    # a daemon thread: connecting to an unreachable cluster retries for minutes, and the pod must go anyway
    worker = threading.Thread(target=lambda: _report_errors(ask, progress), daemon=True)
    worker.start()
    worker.join(args.timeout)
    seconds = time.monotonic() - started
    if "node" not in progress:
        why = progress.get("error", f"not reached within {args.timeout:g}s")
        print(f"drain: no Ray cluster at {args.address!r} ({why}); nothing asked", file=sys.stderr)
    elif not progress.get("saved"):
        print(f"drain: node {progress['node'][:8]}: no visrl run answered within {args.timeout:g}s; going "
              f"without a new checkpoint ({seconds:.1f}s)", file=sys.stderr)
    else:
        steps = ", ".join(f"{run} step {step}" for run, step in sorted(progress["saved"].items()))
        print(f"drain: node {progress['node'][:8]}: saved: {steps} ({seconds:.1f}s); the node can go")
    return 0  # never fail the hook: the pod is deleted either way


def _report_errors(fn, progress: dict) -> None:
    try:
        fn()
    except Exception as e:
        progress["error"] = f"{type(e).__name__}: {str(e)[:200]}"


if __name__ == "__main__":
    sys.exit(main())
