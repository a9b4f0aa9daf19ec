#!/usr/bin/env bash
# validate-k8s.sh [FILE...] — checks Kubernetes manifests (default: deploy/kubernetes/*.yaml
# but the kustomization) against the official Kubernetes JSON schemas with
# kubernetes-validate --strict (unknown fields are errors), for K8S_VERSION (default 1.30.0,
# the oldest release the manifests target). The validator and its schemas come from PyPI,
# pinned and sha256-checked (scripts/k8s-validate-requirements.txt), installed once into
# build/k8s-venv; nothing is fetched at validation time.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${K8S_VENV:-build/k8s-venv}
req=scripts/k8s-validate-requirements.txt
if [ ! -f "$venv/.ok" ] || [ "$req" -nt "$venv/.ok" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes --only-binary=:all: \
        --no-deps -r "$req"
    touch "$venv/.ok"
fi
if [ $# -eq 0 ]; then
    set -- $(ls deploy/kubernetes/*.yaml | grep -v '/kustomization.yaml$')
fi
exec "$venv/bin/kubernetes-validate" --strict --no-warn -k "${K8S_VERSION:-1.30.0}" "$@"
