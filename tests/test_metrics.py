"""What an operator sees: a real Prometheus (Debian's package, installed by the Makefile) scraping a
multi-node Ray cluster (deploy/local_cluster.py) through Ray's own service discovery file, with the
shipped deploy/prometheus/prometheus.yml and alerts.yaml. A short training run whose checkpoint store
stops answering for two saves, then the serve app answering requests; then every metric that
docs/observability.md names, every Grafana panel's query in deploy/grafana/, and the failed-upload
alert are asked of that Prometheus."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from deploy.local_cluster import LocalCluster
from net import free_port
from tests.helpers import Prometheus, poll, signal_at_steps

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
RUN_NAME = "metrics-test"
pytestmark = [pytest.mark.slow,  # a system test: see setup.cfg's markers
              pytest.mark.skipif(shutil.which("prometheus") is None or shutil.which("promtool") is None,
                                 reason="Prometheus is not installed (make test installs Debian's package)")]


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=DEPLOY / "prometheus", capture_output=True, text=True, timeout=60)


def test_alert_rules_pass_promtool():
    checked = promtool("check", "rules", "alerts.yaml")
    assert checked.returncode == 0 and "SUCCESS: 3 rules found" in checked.stdout, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yaml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def train_with_failing_uploads(cluster: LocalCluster, store, run: Path) -> subprocess.CompletedProcess:
    """A short run on the cluster checkpointing every step to S3; the S3 server is stopped (SIGSTOP)
    through the saves of steps 2 and 3, so two uploads fail after trainer.ckpt_timeout_s. It trains
    one-step-off (the engine and the shard awake side by side on the one device), so the async/*
    series are exported too."""
    args = [f"trainer.run_dir={run}", f"data.dataset_dir={run}/data", f"trainer.export_path={run}/exports",
            f"trainer.run_name={RUN_NAME}", "trainer.ckpt_path=s3://metrics/ckpts", f"s3.endpoint_url={store.url}",
            "s3.timeout_s=1", "s3.max_attempts=1", "trainer.ckpt_timeout_s=4", "trainer.ckpt_interval=1",
            "trainer.train_batch_size=4", "trainer.policy_mini_batch_size=4", "generator.n_samples_per_prompt=4",
            "data.train_size=32", "data.eval_size=4", "trainer.eval_interval=4", "trainer.hf_save_interval=100",
            "trainer.placement.device_resource=visrl_device", "trainer.fully_async.enabled=true",
            "generator.inference_engine.enable_sleep=false", "trainer.algorithm.use_tis=true",
            "trainer.algorithm.use_rollout_logprobs=false"]
    proc = subprocess.Popen([sys.executable, "driver.py", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cluster.env())
    try:
        signal_at_steps(proc, run, store.proc.pid, [(1, signal.SIGSTOP), (3, signal.SIGCONT)], 600)
        out, err = proc.communicate(timeout=600)
    finally:
        os.kill(store.proc.pid, signal.SIGCONT)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


SERVE = """
import sys, time, ray
from ray import serve
from serve_app import app
ray.init(namespace="visrl-metrics-test")
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
serve.run(app({"base_model": sys.argv[2], "dynamic_lora_loading_path": sys.argv[3], "max_loras": "1",
               "max_lora_rank": "4", "cache_dir": sys.argv[4]}), name="main", route_prefix="/", blocking=False)
print("SERVING", flush=True)
time.sleep(3600)
"""


def serve_some_requests(cluster: LocalCluster, prometheus: "Prometheus", model_dir: str, adapters: Path,
                        folder: Path) -> None:
    """The serve app on the cluster, asked in two rounds (Prometheus has seen the first before the
    second is sent, so that rates are there to see): the base and an adapter (loaded on its first
    request, resident on its second); then a second adapter, which evicts the first (max_loras=1),
    the first again (loaded again), and the base."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port), model_dir, str(adapters), str(folder / "cache")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env())
    try:
        assert _wait_line(proc, "SERVING"), "the serve app did not start"
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        base = Path(model_dir).name
        rounds = ([base, f"{base}:alpha", f"{base}:alpha"], [f"{base}:beta", f"{base}:alpha", f"{base}:alpha", base])
        asked = 0
        for models in rounds:
            for model in models:
                body = {"model": model, "messages": [{"role": "user", "content": "Which way?"}], "max_tokens": 4,
                        "temperature": 0}
                answer = _post_when_ready(url, body)
                assert answer.status_code == 200, answer.text
            asked += len(models)
            assert poll(prometheus, f"sum(ray_visrl_serve_request_seconds_count) >= {asked}", timeout_s=90)
    finally:
        proc.kill()
        proc.wait()


def _wait_line(proc, word: str, timeout_s: float = 300) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if word in line:
            return True
        if not line and proc.poll() is not None:
            return False
    return False


def _post_when_ready(url: str, body: dict, timeout_s: float = 300) -> requests.Response:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = requests.post(url, json=body, timeout=120)
            if answer.status_code not in (404, 503) or time.monotonic() > deadline:
                return answer
        except requests.ConnectionError:
            if time.monotonic() > deadline:
                raise
        time.sleep(1)


@pytest.fixture(scope="module")
def observed(tmp_path_factory, tiny_model_dir):
    """The cluster, its Prometheus, and the time windows of the training run and of the requests."""
    from deploy.local_s3 import S3Server
    from tests.helpers import make_adapter
    folder = tmp_path_factory.mktemp("observed")
    cluster = LocalCluster(folder / "cluster")
    cluster.up(workers=1, cpus=4, devices=1)
    prometheus = Prometheus(str(Path(cluster.state["temp_dir"]) / "prom_metrics_service_discovery.json"), folder)
    store = S3Server()
    try:
        store.client().create_bucket(Bucket="metrics")
        run = folder / "run"
        started = time.time()
        trained = train_with_failing_uploads(cluster, store, run)
        assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
        history = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [h["ckpt/failed"] for h in history if "ckpt/failed" in h][1:3] == [1.0, 1.0], history
        steps = sum("timing/step" in h for h in history)
        assert poll(prometheus, f'max_over_time(ray_visrl_step_seconds_count{{run="{RUN_NAME}"}}[1h]) >= {steps}',
                    timeout_s=90), "the run's last steps never reached Prometheus"
        training = (started, time.time())
        adapters = folder / "adapters"
        make_adapter(tiny_model_dir, adapters / "alpha", seed=1)
        make_adapter(tiny_model_dir, adapters / "beta", seed=2)
        serve_some_requests(cluster, prometheus, tiny_model_dir, adapters, folder)
        serving = (training[1], time.time())
        yield prometheus, training, serving
    finally:
        store.stop()
        prometheus.stop()
        cluster.down()


def documented_metrics() -> list[str]:
    return sorted(set(re.findall(r"`(ray_visrl_\w+)`", (ROOT / "docs" / "observability.md").read_text())))


def test_every_documented_metric_is_scraped(observed):
    prometheus, _, _ = observed
    names = documented_metrics()
    assert len(names) >= 20, names
    missing = []
    for name in names:
        series = poll(prometheus, f'last_over_time({{__name__=~"{name}(_bucket|_count|_sum)?"}}[1h])')
        if not series:
            missing.append(name)
        elif not name.startswith("ray_visrl_serve_"):
            assert {s["metric"]["run"] for s in series} == {RUN_NAME}, (name, series[:2])
    assert not missing, f"documented but never scraped: {missing}"


def test_gauges_stay_present_between_steps(observed):
    """Between its first and last scrape the last step's loss never drops out of Ray's exports."""
    prometheus, (start, end), _ = observed
    (series,) = poll(prometheus, f'ray_visrl_policy_policy_loss{{run="{RUN_NAME}"}}[1h]')
    stamps = [float(t) for t, _ in series["values"]]
    assert stamps[-1] - stamps[0] > 20, stamps  # spans several steps
    assert max(b - a for a, b in zip(stamps, stamps[1:])) < 10, stamps


def test_checkpoint_upload_alert_fires(observed):
    prometheus, _, _ = observed
    failures = poll(prometheus, f'max_over_time(ray_visrl_checkpoint_upload_failures_total{{run="{RUN_NAME}"}}[1h])')
    assert failures and float(failures[0]["value"][1]) == 2, failures
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        firing = [a for a in prometheus.api("alerts")["alerts"]
                  if a["labels"]["alertname"] == "VisrlCheckpointUploadFailed" and a["state"] == "firing"]
        if firing:
            break
        time.sleep(1)
    assert firing and firing[0]["labels"]["run"] == RUN_NAME, prometheus.api("alerts")
    quiet = {a["labels"]["alertname"] for a in prometheus.api("alerts")["alerts"]} - {"VisrlCheckpointUploadFailed"}
    assert not quiet, quiet  # a healthy run's steps and throughput raise nothing


def fill_variables(expr: str) -> str:
    """A panel's query as Grafana sends it with every variable at All (the run: this test's)."""
    for name, value in (("$run", RUN_NAME), ("$__rate_interval", "30s"), ("$cluster", ".*"), ("$model", ".*"),
                        ("$app", ".*")):
        expr = expr.replace(name, value)
    return expr


@pytest.mark.parametrize("board", ["visrl-training.json", "visrl-serving.json"])
def test_every_dashboard_panel_returns_data(observed, board):
    prometheus, training, serving = observed
    start, end = training if "training" in board else serving
    panels = json.loads((DEPLOY / "grafana" / board).read_text())["panels"]
    empty, asked = [], 0
    for panel in panels:
        if panel.get("description", "").startswith(("GPU nodes only", "backend=vllm only")):
            continue  # GPU metrics need NVML (none here); vLLM's are checked in tests/on_vllm
        for target in panel["targets"]:
            expr = fill_variables(target["expr"])
            points = [float(v) for s in prometheus.query_range(expr, start, end + 30) for _, v in s["values"]]
            asked += 1
            if not any(p == p for p in points):  # NaN != NaN: a histogram quantile with no observations
                empty.append((panel["title"], expr))
    assert asked >= 5 and not empty, empty
