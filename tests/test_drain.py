"""A worker node's preStop hook and the driver, through a real Ray's key-value store
(controller/drain.py, controller/preemption.py). The whole path on a multi-node cluster, a node
drained and then SIGTERMed with nothing lost: tests/test_cluster.py's lost-nodes test."""
import subprocess
import sys
import threading
import time

import pytest

from controller import drain
from controller.preemption import Preempted, Preemption
from tests.helpers import ROOT


@pytest.fixture(scope="module")
def local_ray():
    import ray
    ray.init(num_cpus=1, include_dashboard=False, namespace="visrl-drain-test")
    yield
    ray.shutdown()


def ask_in_background(node: str, timeout_s: float) -> dict:
    answer = {}
    thread = threading.Thread(target=lambda: answer.update(saved=drain.request(node, timeout_s, poll_s=0.05)))
    thread.start()
    answer["thread"] = thread
    return answer


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_without_a_run_the_hook_asks_nothing_and_returns(local_ray):
    started = time.monotonic()
    assert drain.request("node-a", timeout_s=60) == {}
    assert time.monotonic() - started < 30  # returned at once, not after the timeout
    assert drain.asked("run-1") == []


def test_a_draining_node_abandons_the_step_before_its_update_and_gets_the_saved_step(local_ray):
    drain.driver_started("run-1")
    try:
        asking = ask_in_background("node-a", timeout_s=120)
        wait_until(lambda: drain.asked("run-1") == ["node-a"])
        preemption = Preemption(60.0, lambda: 3, drains=lambda: drain.asked("run-1"))
        preemption.step_started()
        with pytest.raises(Preempted):  # generating: nothing updated yet, the step is abandoned
            preemption.at_phase("generate")
        assert preemption.draining == ["node-a"] and preemption.save_now and preemption.requested is None
        drain.answer(preemption.draining, 3, "run-1")
        assert drain.asked("run-1") == []  # answered: the run does not abandon its next step for it
        asking["thread"].join(30)
        assert asking["saved"] == {"run-1": 3}
    finally:
        drain.driver_stopped("run-1")


def test_a_step_past_its_update_finishes_and_saves(local_ray):
    drain.driver_started("run-1")
    try:
        preemption = Preemption(60.0, lambda: 0, drains=lambda: drain.asked("run-1"))
        preemption.step_started()
        preemption.at_phase("train")  # the update began: the step finishes
        assert not preemption.save_now
        asking = ask_in_background("node-b", timeout_s=120)
        wait_until(lambda: drain.asked("run-1") == ["node-b"])
        time.sleep(0.6)  # past the poll interval
        preemption.at_phase("sync")  # no Preempted: committed
        assert preemption.save_now  # the step's end saves whatever trainer.ckpt_interval says
        drain.answer(preemption.draining, 5, "run-1")
        asking["thread"].join(30)
        assert asking["saved"] == {"run-1": 5}
    finally:
        drain.driver_stopped("run-1")


def test_with_two_runs_the_node_waits_for_both(local_ray):
    """Two jobs on one cluster: each saves before the node goes; one answering does not release it."""
    drain.driver_started("run-1")
    drain.driver_started("run-2")
    try:
        asking = ask_in_background("node-c", timeout_s=120)
        wait_until(lambda: drain.asked("run-1") == ["node-c"] == drain.asked("run-2"))
        drain.answer(["node-c"], 4, "run-1")
        time.sleep(0.5)
        assert asking["thread"].is_alive() and drain.asked("run-2") == ["node-c"] and drain.asked("run-1") == []
        drain.answer(["node-c"], 7, "run-2")
        asking["thread"].join(30)
        assert asking["saved"] == {"run-1": 4, "run-2": 7}
    finally:
        drain.driver_stopped("run-1")
        drain.driver_stopped("run-2")


def test_the_hook_stops_waiting_when_the_run_ends(local_ray):
    drain.driver_started("run-1")
    asking = ask_in_background("node-d", timeout_s=120)
    wait_until(lambda: drain.asked("run-1") == ["node-d"])
    drain.driver_stopped("run-1")
    asking["thread"].join(30)
    assert not asking["thread"].is_alive() and asking["saved"] == {}
    assert drain.asked("run-1") == []  # it took its question back


def test_the_hook_without_a_cluster_says_so_and_lets_the_pod_go():
    out = subprocess.run([sys.executable, "-m", "controller.drain", "--address", "127.0.0.1:1", "--timeout", "5"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "nothing asked" in out.stderr
