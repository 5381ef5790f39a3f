#!/usr/bin/env bash
# KubeRay's own CRDs (RayJob, RayService) of the release the manifests are written for, into
# runs/kuberay-crds/, checked against their sha256; tests/test_deploy.py validates the manifests
# against them when they are there (VISRL_KUBERAY_CRDS points elsewhere). Needs GitHub.
set -euo pipefail
release=v1.7.0
dest=${VISRL_KUBERAY_CRDS:-$(dirname "$0")/../../runs/kuberay-crds}
mkdir -p "$dest"
while read -r sum name; do
  curl -fsSL -o "$dest/$name" "https://raw.githubusercontent.com/ray-project/kuberay/$release/ray-operator/config/crd/bases/$name"
  echo "$sum  $dest/$name" | sha256sum -c -
done <<'SUMS'
01a5cf3b17c1769fda44af7e82debcd98722f0c27b9ab84d084681c6649121f5 ray.io_rayjobs.yaml
0a8fc325e6e22b9231c1f282b309555e2ecf94227ca20a03df3d1d9a403907ab ray.io_rayservices.yaml
SUMS
