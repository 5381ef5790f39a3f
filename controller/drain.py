"""A worker node about to go asks the driver for a checkpoint first.

A pod deletion, a spot reclaim or a node drain sends SIGTERM to the worker's processes, then SIGKILL:
the policy shards on that node take their part of the optimizer with them, and the run would go back
to its last checkpoint (up to `trainer.ckpt_interval` steps). The worker pod's preStop hook runs
`python -m controller.drain` before the SIGTERM: it asks the driver through Ray's key-value store
and waits for the answer. The driver abandons a step that has not reached its update (or finishes
one that has), saves, and answers with the saved step; the hook returns, the node goes, and the
recovery restores that checkpoint: nothing is lost. The wait is bounded (`--timeout`), and without a
visrl run on the cluster the hook returns at once.

    python -m controller.drain --timeout 100     # in the worker pod (deploy/kuberay/rayjob-train.yaml)
"""
from __future__ import annotations

import argparse
import sys
import threading
import time

NAMESPACE = "visrl_drain"
RUNNING = b"running"  # set while a driver answers drains


def _kv():
    from ray.experimental import internal_kv
    return internal_kv


def driver_started() -> None:
    _kv()._internal_kv_put(RUNNING, b"1", overwrite=True, namespace=NAMESPACE)


def driver_stopped() -> None:
    _kv()._internal_kv_del(RUNNING, namespace=NAMESPACE)


def asked() -> list[str]:
    """The nodes that asked for a checkpoint and have no answer yet (the driver's side)."""
    keys = _kv()._internal_kv_list(b"ask/", namespace=NAMESPACE)
    return sorted(k.decode()[len("ask/"):] for k in keys)


def answer(nodes: list[str], step: int) -> None:
    """Tell each asking node that the state of `step` is saved."""
    kv = _kv()
    for node in nodes:
        kv._internal_kv_put(f"done/{node}".encode(), str(step).encode(), overwrite=True, namespace=NAMESPACE)
        kv._internal_kv_del(f"ask/{node}".encode(), namespace=NAMESPACE)


def request(node: str, timeout_s: float, poll_s: float = 0.2) -> int | None:
    """Ask for a checkpoint on behalf of `node` and wait for it: the saved step, or None when no run
    is there to answer or none came within timeout_s."""
    kv = _kv()
    if not kv._internal_kv_exists(RUNNING, namespace=NAMESPACE):
        return None
    done = f"done/{node}".encode()
    kv._internal_kv_del(done, namespace=NAMESPACE)
    kv._internal_kv_put(f"ask/{node}".encode(), str(time.time()).encode(), overwrite=True, namespace=NAMESPACE)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        step = kv._internal_kv_get(done, namespace=NAMESPACE)
        if step is not None:
            kv._internal_kv_del(done, namespace=NAMESPACE)
            return int(step)
        if not kv._internal_kv_exists(RUNNING, namespace=NAMESPACE):  # the run ended meanwhile
            break
        time.sleep(poll_s)
    kv._internal_kv_del(f"ask/{node}".encode(), namespace=NAMESPACE)  # nobody answered: do not leave it asking
    return None


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
        progress["step"] = request(progress["node"], max(args.timeout - (time.monotonic() - started), 0.0))

    # a daemon thread: connecting to an unreachable cluster retries for minutes, and the pod must go anyway
    worker = threading.Thread(target=lambda: _report_errors(ask, progress), daemon=True)
    worker.start()
    worker.join(args.timeout)
    seconds = time.monotonic() - started
    if "node" not in progress:
        why = progress.get("error", f"not reached within {args.timeout:g}s")
        print(f"drain: no Ray cluster at {args.address!r} ({why}); nothing asked", file=sys.stderr)
    elif progress.get("step") is None:
        print(f"drain: node {progress['node'][:8]}: no visrl run answered within {args.timeout:g}s; going "
              f"without a new checkpoint ({seconds:.1f}s)", file=sys.stderr)
    else:
        print(f"drain: node {progress['node'][:8]}: the run saved step {progress['step']} ({seconds:.1f}s); "
              "the node can go")
    return 0  # never fail the hook: the pod is deleted either way


def _report_errors(fn, progress: dict) -> None:
    try:
        fn()
    except Exception as e:
        progress["error"] = f"{type(e).__name__}: {str(e)[:200]}"


if __name__ == "__main__":
    sys.exit(main())
