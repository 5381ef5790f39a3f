"""The serving board's vLLM panels against a real Prometheus: ray.serve.llm on vLLM's CPU build in a
cluster of deploy/local_cluster.py, answering requests for the base and an adapter; every vLLM panel's
query returns data (tests/test_metrics.py does the same for the other panels, without vLLM)."""
import json
import shutil
import subprocess
import sys
import time

import pytest
import requests

from deploy.local_cluster import LocalCluster
from net import free_port
from tests.helpers import EMBEDDED_BASE, ROOT, Prometheus, make_adapter, poll

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="Prometheus is not installed (make test installs Debian's package)")

SERVE = """
import os, sys, time, ray
from ray import serve
from serve_app import app
# the worker node's processes have no S3 credentials of their own: the job passes the test server's on
creds = {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
ray.init(namespace="visrl-vllm-metrics", runtime_env={"env_vars": creds})
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[1])})
serve.run(app({"base_model": sys.argv[2], "backend": "vllm", "dynamic_lora_loading_path": "s3://metrics/adapters",
               "s3_endpoint_url": sys.argv[3], "max_loras": "2", "max_lora_rank": "8", "num_cpus": "2"}),
          name="vllm", route_prefix="/", blocking=False)
print("SERVING", flush=True)
time.sleep(3600)
"""


def test_every_vllm_panel_of_the_serving_board_returns_data(s3_server, tmp_path):
    from envs.maze import MazeEnv
    from serving.maze_client import data_url
    adapter = make_adapter(EMBEDDED_BASE, tmp_path / "alpha", seed=1, rank=8, scale=0.7)
    s3 = s3_server.client()
    s3.create_bucket(Bucket="metrics")
    for f in ("adapter_config.json", "adapter_model.safetensors"):
        s3.upload_file(f"{adapter}/{f}", "metrics", f"adapters/alpha/{f}")
    cluster = LocalCluster(tmp_path / "cluster")
    cluster.up(workers=1, cpus=8, devices=0)
    prometheus = Prometheus(f"{cluster.state['temp_dir']}/prom_metrics_service_discovery.json", tmp_path)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVE, str(port), EMBEDDED_BASE, s3_server.url], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env())
    started = time.time()
    try:
        deadline = time.monotonic() + 600
        while "SERVING" not in (proc.stdout.readline() or "") and time.monotonic() < deadline:
            assert proc.poll() is None, "the ray.serve.llm app did not start"
        url = data_url(MazeEnv(cell_px=16).reset(seed=7)[0])
        body = {"max_tokens": 8, "temperature": 0, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}
        for model in ("maze-vl-base", "maze-vl-base:alpha", "maze-vl-base", "maze-vl-base:alpha"):
            answer = requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body | {"model": model}, timeout=300)
            assert answer.status_code == 200, answer.text
        assert poll(prometheus, "ray_vllm_num_requests_running", timeout_s=120), "vLLM's series never reached Prometheus"
        board = json.loads((ROOT / "deploy" / "grafana" / "visrl-serving.json").read_text())
        panels = [p for p in board["panels"] if p["description"].startswith("backend=vllm only")]
        empty = []
        for panel in panels:
            for target in panel["targets"]:
                expr = target["expr"].replace("$cluster", ".*").replace("$__rate_interval", "30s")
                points = [v for s in prometheus.query_range(expr, started, time.time() + 5) for _, v in s["values"]]
                if not points:
                    empty.append((panel["title"], expr))
        assert len(panels) >= 2 and not empty, empty
    finally:
        proc.kill()
        proc.wait()
        prometheus.stop()
        cluster.down()
