"""What an operator runs visrl with: a multi-node Ray cluster on one machine (local_cluster.py), and,
as files, the image recipes, KubeRay manifests, Prometheus rules and Grafana dashboards."""
