"""A run's metrics as Ray application metrics, for Prometheus and the Grafana dashboards in deploy/.

Ray exports application metrics on each node's metrics port with a `ray_` prefix: `visrl_step_seconds`
here is `ray_visrl_step_seconds` in Prometheus (docs/observability.md lists them). Every series has
the tag `run` (trainer.run_name). What is exported:
- every number of a step's metrics as a gauge, `visrl_<name>` (`policy/policy_loss` ->
  `visrl_policy_policy_loss`): its last value, re-set every few seconds so that it stays present
  between steps (a gauge set once a step can drop out of Ray's exports in between);
- histograms of the step's episode returns, the size of its advantages, the step's seconds, each
  checkpoint upload's seconds, and each adapter load at a sync;
- a counter of failed checkpoint uploads (the alert in deploy/prometheus/alerts.yaml). Ray counters
  cannot start at 0: its series appears with the first failure, already at 1.
GPU utilisation and memory come from Ray's own node metrics (`ray_node_gpus_utilization`,
`ray_node_gram_used`), which every GPU node exports. Without Ray (tests, tools) nothing is exported.
"""
from __future__ import annotations

import math
import re
import threading

LATENCY_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600]
HISTOGRAMS = {  # metric key -> (name, description, buckets); Ray takes positive bucket bounds only
    "samples/return": ("visrl_episode_return", "return of each rollout episode", [0.25, 0.5, 0.75, 1.0]),
    # the size of each turn's advantage (a bucket per magnitude; the signed spread is in the gauges
    # visrl_advantages_mean/std/min/max)
    "samples/advantage": ("visrl_advantage_abs", "|advantage| of each turn", [0.01, 0.1, 0.25, 0.5, 1, 2, 4]),
    "timing/step": ("visrl_step_seconds", "seconds a training step takes", LATENCY_BUCKETS),
    "ckpt/save_s": ("visrl_checkpoint_upload_seconds", "seconds a checkpoint save takes", LATENCY_BUCKETS),
    "sync/adapter_load_s": ("visrl_adapter_sync_seconds", "seconds the engines take to load a synced adapter",
                            LATENCY_BUCKETS),
}
COUNTERS = {"ckpt/failed": ("visrl_checkpoint_upload_failures", "checkpoint saves that failed")}


def gauge_name(key: str) -> str:
    return "visrl_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class PrometheusExporter:
    def __init__(self, run: str, refresh_s: float = 5.0):
        self.run, self.refresh_s = run, refresh_s
        self.gauges, self.values, self.histograms, self.counters = {}, {}, {}, {}
        self.lock, self.stop = threading.Lock(), threading.Event()
        self.thread = None

    def _metrics(self):
        try:
            import ray
            if not ray.is_initialized():
                return None
            from ray.util import metrics
            return metrics
        except ImportError:
            return None

    def _make(self, table: dict, kind, name: str, description: str, **kwargs):
        if name not in table:
            table[name] = kind(name, description=description, tag_keys=("run",), **kwargs)
            table[name].set_default_tags({"run": self.run})
        return table[name]

    def observe(self, numbers: dict, samples: dict) -> None:
        """A step's metrics: `numbers` {key: float}, `samples` {key: list of values} (histograms only)."""
        m = self._metrics()
        if m is None:
            return
        with self.lock:
            for key, value in numbers.items():
                self._make(self.gauges, m.Gauge, gauge_name(key), f"visrl {key} (last step)").set(value)
                self.values[gauge_name(key)] = value
                if key in COUNTERS and value > 0:
                    self._make(self.counters, m.Counter, *COUNTERS[key]).inc(value)
                if key in HISTOGRAMS:
                    name, description, buckets = HISTOGRAMS[key]
                    self._make(self.histograms, m.Histogram, name, description, boundaries=buckets).observe(value)
            for key, values in samples.items():
                if key in HISTOGRAMS:
                    name, description, buckets = HISTOGRAMS[key]
                    histogram = self._make(self.histograms, m.Histogram, name, description, boundaries=buckets)
                    for v in values:
                        if math.isfinite(v):
                            histogram.observe(abs(float(v)) if key == "samples/advantage" else float(v))
        if self.thread is None:
            self.thread = threading.Thread(target=self._refresh, name="visrl-metrics", daemon=True)
            self.thread.start()

    def _refresh(self) -> None:
        """Re-set every gauge to its last value until closed."""
        while not self.stop.wait(self.refresh_s):
            with self.lock:
                for name, value in self.values.items():
                    self.gauges[name].set(value)

    def close(self) -> None:
        self.stop.set()
