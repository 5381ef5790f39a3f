"""What a run shows: metrics.jsonl, TensorBoard events, Prometheus metrics, the learning curve."""
